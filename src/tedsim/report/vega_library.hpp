#pragma once
// Vega, inlined into a page so the report opens offline. Debian's libjs-vega ships Vega as its
// separate modules (UMD builds, no single bundle), and their global-variable fallback overwrites
// `window.vega` module by module; each module is therefore loaded through a tiny AMD `define` that
// records its exports under the module's name, then the modules are merged into one `vega` object
// and the transforms registered, as Vega's own index module does.
#include <string>

namespace tedsim {

// Where the modules are read from: $TEDSIM_VEGA_DIR, else the folder found at build time
// (/usr/share/javascript/vega from Debian's libjs-vega).
std::string vega_directory();

// The <script> elements that define `window.vega` (Vega 5's runtime, parser and SVG renderer).
// Throws InputError naming the missing file and the package that provides it.
std::string inline_vega_scripts();

}  // namespace tedsim
