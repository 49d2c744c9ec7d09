// Where forge_make_traces (make_traces.py) writes the test models' recorded traces: the build
// directory, never the source tree. Shared by the forge tests that read them.
#pragma once

#include <filesystem>

namespace crucible::forge {

inline std::filesystem::path traces_dir() { return CRUCIBLE_FORGE_TRACES; }

}  // namespace crucible::forge
