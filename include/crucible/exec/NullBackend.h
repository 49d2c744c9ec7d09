// NullBackend.h — the backend that generates nothing: every kernel runs as library calls through
// the provider, on host memory. With the ATen provider it is the replay of the recorded ops; it
// is also the skeleton a new backend copies (NullBackend.cpp fills every slot by name).
#pragma once

#include "crucible/exec/Backend.h"

namespace crucible::exec {

Backend null_backend();

}  // namespace crucible::exec
