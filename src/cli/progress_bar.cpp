#include "progress_bar.hpp"

#include <unistd.h>

#include <cstdio>

namespace tedsim::cli {

ProgressBar::ProgressBar(std::string what)
    : what_(std::move(what)),
      enabled_(isatty(STDOUT_FILENO) && isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::update(long long done, long long total) {
  if (!enabled_ || total <= 0) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (elapsed < 1.0) return;
  const double share = double(done) / double(total);
  constexpr int kWidth = 30;
  const int filled = int(share * kWidth);
  std::string bar(std::size_t(filled), '#');
  bar.resize(kWidth, '.');
  const double rate = elapsed > 0 ? done / elapsed : 0;
  const double left = rate > 0 ? (total - done) / rate : 0;
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %lld / %lld, %.0f/s, %.1f s left\033[K", what_.c_str(), bar.c_str(),
               100 * share, done, total, rate, left);
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace tedsim::cli
