// refusal_test.cpp — one test per refusal class of notes/pt-loader-security.md, on the malicious
// and broken files make_fixtures.py crafts. Each must fail with a message that names the reason
// and the byte offset, and nothing but the error comes back.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "crucible/ptload/StateDict.h"
#include "fixture_util.h"

namespace {
using namespace crucible::ptload;

// Each file must be refused with `reason` in the message and an offset named.
void expect_refused(const std::vector<std::pair<std::string, std::string>>& cases,
                    bool names_offset = true) {
  for (const auto& [file, reason] : cases) {
    SCOPED_TRACE(file);
    const std::string path = test::fixture("bad/" + file + ".pt");
    ASSERT_FALSE(test::read_file(path).empty()) << "fixture missing: " << path;
    auto sd = StateDict::open(path);
    ASSERT_FALSE(sd.ok()) << "accepted a file that must be refused";
    const std::string msg(sd.status().message());
    EXPECT_NE(msg.find(reason), std::string::npos) << msg;
    if (names_offset) {
      EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find("; "), std::string::npos) << "says what to do: " << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << "names the file: " << msg;
  }
}

TEST(Refuse, GlobalsNotOnTheAllowlist) {
  expect_refused(
      {{"global_os_system", "GLOBAL os.system is not on the allowlist"},
       {"global_near_miss", "GLOBAL torch._utils._rebuild_tensor is not on the allowlist"}});
}

TEST(Refuse, ReduceNewobjBuildOnAnythingButAllowedCallables) {
  expect_refused({{"reduce_storage_class", "REDUCE on global torch.FloatStorage"},
                  {"newobj_rebuild", "NEWOBJ on global torch._utils._rebuild_tensor_v2"},
                  {"build_on_list", "BUILD on a list"},
                  {"tensor_hooks", "with backward hooks"}});
}

TEST(Refuse, SetitemOnNonDictAppendOnNonList) {
  expect_refused(
      {{"setitem_on_list", "SETITEM(S) on a list"}, {"append_on_dict", "APPEND to a dict"}});
}

TEST(Refuse, MalformedPersistentIds) {
  expect_refused({{"persid_short", "persistent id a tuple of 4 items"},
                  {"persid_tag", "persistent id tag is a str, not 'storage'"},
                  {"persid_key", "key '../0' is not a plain record name"},
                  {"persid_missing", "storage record 'a/data/9' named by the pickle is missing"},
                  {"persid_not_tuple", "persistent id a str"},
                  {"storage_type_clash", "referenced twice with different types or sizes"}});
}

TEST(Refuse, SizesThatDisagreeWithTheStorage) {
  expect_refused({{"numel_vs_record", "holds 16 bytes but the pickle says 100 elements of float32"},
                  {"view_outside", "reaches element 19 but the storage has 4 elements"},
                  {"view_offset_outside", "reaches element 4 but the storage has 4 elements"},
                  {"stride_overflow", "overflows 64 bits"},
                  {"negative_stride", "negative stride -1"}});
}

TEST(Refuse, TorchScriptArchives) {
  expect_refused({{"torchscript", "a TorchScript archive (torch.jit.save"}});
}

TEST(Refuse, OpcodesOutsideTheSet) {
  expect_refused({{"opcode_stack_global", "opcode STACK_GLOBAL is not allowed"},
                  {"opcode_inst", "opcode INST is not allowed"},
                  {"opcode_obj", "opcode OBJ is not allowed"},
                  {"opcode_ext1", "opcode EXT1 is not allowed"},
                  {"protocol4", "pickle protocol 4"}});
}

TEST(Refuse, MemoStackMarkAndLengthErrors) {
  expect_refused({{"memo_out_of_range", "memo index 7 was never stored"},
                  {"stack_underflow", "stack underflow"},
                  {"mark_open_at_stop", "MARK(s) still open at STOP"},
                  {"tuple_without_mark", "no MARK to pop to"},
                  {"length_past_end", "needs 1000 bytes but only 3 are left"},
                  {"cycle", "contains itself"},
                  {"truncated", "no zip end-of-central-directory record"}});
}

TEST(Refuse, ZipStructure) {
  expect_refused({{"zip_traversal", "path traversal ('..') in entry name 'a/../../etc/passwd'"},
                  {"zip_absolute", "absolute entry name '/etc/passwd'"},
                  {"zip_duplicate", "duplicate entry name 'a/data.pkl'"},
                  {"zip_overlap", "entries 'a/data.pkl' and 'a/data/0' overlap"},
                  {"zip_outside", "has no local header at its offset"},
                  {"zip_encrypted", "is encrypted"},
                  {"zip_crc", "fails its checksum"},
                  {"zip_bomb", "more than deflate can produce"}});
}

TEST(Refuse, ByteorderOtherThanLittleOrBig) {
  expect_refused({{"byteorder_middle", "byteorder record says 'middle'"}});
}

TEST(Refuse, LegacyNonZipStreams) {
  expect_refused({{"legacy", "a legacy (PyTorch < 1.6, non-zip) torch.save file"}});
  auto sd = StateDict::open(test::fixture("bad/legacy.pt"));
  EXPECT_NE(sd.status().message().find("re-save it with torch.save in a current PyTorch"),
            std::string::npos);
}

TEST(Refuse, SharedObjectGraphsThatExplodeWhenListed) {
  // No single byte is at fault here: the message names the cause instead of an offset.
  expect_refused({{"dag_bomb", "revisits shared containers too often"},
                  {"key_repr_bomb", "revisits shared containers too often"}},
                 /*names_offset=*/false);
}

TEST(Refuse, WorkOutOfProportionToTheFile) {
  expect_refused({{"setitem_bomb", "dict keys set again and again"}});
  expect_refused({{"expanded_view", "expanded or overlapping view"}}, /*names_offset=*/false);
}

}  // namespace
