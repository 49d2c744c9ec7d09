// Status.cpp — message_of (Status.h).
#include "crucible/core/Status.h"

#include <sstream>

namespace crucible {

std::string message_of(const Status& s) {
#if _GLIBCXX_USE_CXX11_ABI
  return std::string(s.message());
#else
  // Note [Old std::string ABI] (cmake/CrucibleDeps.cmake): Abseil's operator<< is compiled
  // code, so it reads the message with the layout that wrote it, and hands its characters to
  // an std::ostream, which both ABIs share. It writes "<CODE NAME>: <message>" (the code's
  // name has no ": "), or "OK".
  if (s.ok()) return {};
  std::ostringstream os;
  os << s;
  const std::string text = os.str();
  const std::size_t colon = text.find(": ");
  return colon == std::string::npos ? text : text.substr(colon + 2);
#endif
}

}  // namespace crucible
