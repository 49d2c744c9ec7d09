// ThreadName.h — names the calling thread for top, perf and gdb (Linux: at most 15 characters).
#pragma once

#if defined(__linux__)
#include <pthread.h>
#endif

namespace crucible {

inline void name_this_thread(const char* name) noexcept {
#if defined(__linux__)
  (void)pthread_setname_np(pthread_self(), name);  // fails only for a name over 15 characters
#else
  (void)name;
#endif
}

}  // namespace crucible
