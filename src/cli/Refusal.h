// Refusal.h — names the class of a ptload refusal and explains it in plain words.
//
// The loader's message says exactly what is wrong and where (byte offset, opcode); a user who
// is not a pickle expert also needs to know what that class of refusal means for them (could
// the file run code? is it damaged? was it written by something other than torch.save?) and
// what to do. The classes are a data table in Refusal.cpp, matched by the loader's wording;
// first match wins, and a message no row knows gets the generic class "other".
#pragma once

#include <string>
#include <string_view>

namespace crucible::cli {

struct RefusalClass {
  std::string_view needle;       // a phrase of the loader's message that selects this row
  std::string_view id;           // stable name for scripts: "code-import", "checksum", ...
  std::string_view title;        // one line
  std::string_view explanation;  // what it means and what to do; "{}" is replaced by detail
  std::string_view detail_from;  // detail = message text between these two (may be empty)
  std::string_view detail_to;
};

const RefusalClass& classify_refusal(std::string_view message);

// The row's explanation with "{}" replaced by the detail taken from `message`.
std::string explain_refusal(const RefusalClass& c, std::string_view message);

}  // namespace crucible::cli
