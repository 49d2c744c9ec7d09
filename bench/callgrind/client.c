/* client.c — lets a Python benchmark start and stop callgrind's counting around the code it
 * measures (valgrind's client requests are inline machine code, so they need a C function).
 * Outside valgrind both functions do nothing. */
#include <valgrind/callgrind.h>

void crucible_callgrind_start(void) {
  CALLGRIND_ZERO_STATS;
  CALLGRIND_START_INSTRUMENTATION;
}

void crucible_callgrind_stop(void) {
  CALLGRIND_STOP_INSTRUMENTATION;
  CALLGRIND_DUMP_STATS;
}
