// Refusal.cpp — the table of ptload refusal classes (see Refusal.h).
#include "Refusal.h"

#include <iterator>

namespace crucible::cli {
namespace {

constexpr std::string_view kResaveTrusted =
    "Do not open it with torch.load. If you trust where it came from, load it there and save "
    "only the weights: torch.save(model.state_dict(), path).";

// Specific phrases first: the generic "pt pickle:" and "pt zip:" rows come last.
constexpr RefusalClass kClasses[] = {
    {"is not on the allowlist", "code-import", "the file imports something that is not a tensor",
     "The pickle asks to import {}, which is not one of the globals torch.save uses to rebuild "
     "tensors. torch.load without weights_only=True would import it and may call it: loading "
     "this file with torch.load could execute code on your machine.",
     "GLOBAL ", " is not on the allowlist"},
    {"with backward hooks", "code-hooks", "a tensor carries backward hooks",
     "A tensor in the file is saved with backward hooks. Hooks are Python callables: restoring "
     "them means running code the file names. A state dict never holds hooks.",
     "", ""},
    {"pickle protocol ", "pickle-protocol", "the pickle was not written by torch.save's default",
     "The pickle uses protocol {}, while torch.save writes protocol 2 unless pickle_protocol= is "
     "passed. Only protocol 2 is read here. Re-save with torch.save(obj, path) and no "
     "pickle_protocol argument.",
     "pickle protocol ", ";"},
    {"is not allowed (opcode", "pickle-opcode",
     "the pickle uses an instruction torch.save never writes",
     "The pickle contains {}, an instruction outside the fixed set torch.save(state_dict) writes. "
     "Several such instructions (INST, OBJ, STACK_GLOBAL, EXT*) import or call arbitrary objects, "
     "so the file was made by another writer, possibly to execute code when unpickled.",
     "refused: ", " is not allowed"},
    {"unknown opcode byte", "pickle-opcode",
     "the pickle uses an instruction torch.save never writes",
     "The pickle contains a byte that is no pickle instruction at all: the file is corrupt or "
     "crafted.",
     "", ""},
    {"refused: REDUCE on", "code-call", "the pickle calls something that is not a tensor rebuild",
     "The pickle calls an object other than the few functions that rebuild tensors and "
     "containers. Calls are how a pickle runs code: torch.load would make this call.",
     "", ""},
    {"refused: NEWOBJ", "code-call", "the pickle constructs an object that is not a container",
     "The pickle constructs an object other than an OrderedDict. Constructing arbitrary classes "
     "is how a pickle runs code: torch.load would do it.",
     "", ""},
    {"refused: BUILD", "code-call", "the pickle sets state on an object that is not a state dict",
     "The pickle sets attributes (BUILD) on something other than an OrderedDict's metadata. On a "
     "crafted class, BUILD calls __setstate__, which can run code.",
     "", ""},
    {"refused: a second BUILD", "code-call", "the pickle sets state on an object twice",
     "The pickle sets an OrderedDict's attributes twice, which torch.save never does: the file "
     "is crafted.",
     "", ""},
    {"refused: call of a non-callable", "code-call",
     "the pickle calls something that cannot be called",
     "The pickle tries to call a value that is not a function: the file is crafted or corrupt.", "",
     ""},
    {"TorchScript archive", "torchscript", "a TorchScript model, not a state dict",
     "The file was written by torch.jit.save: it holds code (the code/ folder) that runs when it "
     "is loaded. Only weights are read here. In PyTorch: m = torch.jit.load(path); "
     "torch.save(m.state_dict(), 'weights.pt').",
     "", ""},
    {"legacy (PyTorch < 1.6", "legacy-format", "the old, non-zip torch.save format",
     "The file uses the pre-1.6 format (or _use_new_zipfile_serialization=False): a bare pickle "
     "stream that is not read here. In a PyTorch you trust with this file: "
     "torch.save(torch.load(path), new_path) writes the zip format.",
     "", ""},
    {"not a torch.save zip archive", "not-pt", "not a torch.save file",
     "The file does not start like a torch.save archive (a zip). It may be another format "
     "(safetensors, numpy, ONNX, a TorchScript or legacy file renamed), or damaged at the start.",
     "", ""},
    {"every CRC-32 field of this archive is 0", "no-checksums",
     "the file was saved without checksums",
     "Every CRC-32 field of the archive is 0: torch.save writes that after "
     "torch.serialization.set_crc32_options(False), to save time on large files. Nothing then "
     "tells whether the data was damaged in transfer or modified since. Re-save it with "
     "checksums (torch.serialization.set_crc32_options(True) before torch.save), or, if you "
     "trust this copy, pass --allow-zero-crc to load it unverified.",
     "", ""},
    {"fails its checksum", "checksum", "the data does not match its checksum",
     "A record's bytes differ from the CRC-32 stored when the file was written: the file was "
     "damaged (interrupted download, disk or transfer error) or modified after saving. Copy or "
     "download it again and compare its hash with the source.",
     "", ""},
    {"no zip end-of-central-directory record", "truncated", "the file ends early",
     "The zip directory that every torch.save file ends with is missing: the file is most likely "
     "truncated (an incomplete download or copy). Copy or download it again.",
     "", ""},
    {"unpickling memory", "memory-bomb", "the pickle would build more than memory allows",
     "The pickle (data.pkl) would build more objects, stack, memo or tensor names than the "
     "loader lets it hold in memory. torch.save's pickles take 2-3 KB a tensor, so the "
     "default limit holds about 100,000 tensors: this pickle pushes, nests or repeats objects "
     "far beyond what a state dict needs, most likely to exhaust memory. If you trust the file, "
     "raise the limit with --max-pickle-memory N.",
     "", ""},
    {"over the limit of", "decompression-bomb", "a record would inflate past the loader's limit",
     "A zip record is, or inflates to, more than the loader allows before it allocates memory: "
     "the pickle (data.pkl) past a size no state dict needs, or a deflated record past a "
     "compression ratio real data does not reach. torch.save never compresses records, so this "
     "is most likely a decompression bomb, a small file made to exhaust memory. If you trust the "
     "file, raise the limit the message names (--max-pickle-bytes, --max-inflate-ratio).",
     "", ""},
    {"pt zip:", "zip-structure", "the zip container is malformed",
     "The zip structure is broken or crafted (entries outside the file or overlapping, unsafe "
     "names such as '..' or absolute paths, encryption, impossible sizes). torch.save never "
     "writes such a file. Download it again; if the refusal stays, the file was not written by "
     "torch.save or was tampered with.",
     "", ""},
    {"which is not loaded", "dtype", "a tensor has a dtype that is not read",
     "A storage holds a dtype this loader does not read (complex, quantized, float8, ...). Only "
     "float32/64, float16, bfloat16, int8/16/32/64, uint8 and bool are read. Convert before "
     "saving, e.g. {k: v.float() for k, v in sd.items()}.",
     "", ""},
    {"persistent id", "storage-reference", "a tensor's storage reference is malformed",
     "The pickle refers to tensor data in a way torch.save never writes (wrong tag, type, key or "
     "count). The file is corrupt or crafted; a reader that trusted it could read the wrong "
     "bytes. Re-save it with torch.save.",
     "", ""},
    {"storage record '", "storage-reference", "a tensor's data record is missing or the wrong size",
     "The pickle names a data record that is missing from the archive, or whose size does not "
     "match the element count the pickle states. The file is truncated, corrupt or crafted; a "
     "reader that trusted the pickle could read past the data. Re-save it with torch.save.",
     "", ""},
    {"referenced twice", "storage-reference", "one storage is described two ways",
     "Two tensors refer to the same data record with different dtypes or sizes. torch.save never "
     "writes that; the file is corrupt or crafted.",
     "", ""},
    {"pt tensor on storage", "tensor-extent", "a tensor reaches outside its data",
     "A tensor's shape, strides or offset reach outside its storage or overflow 64-bit "
     "arithmetic. Reading it would touch memory that is not the tensor's data. torch.save never "
     "writes that; the file is corrupt or crafted.",
     "", ""},
    {"revisits shared containers", "object-graph-bomb", "an object graph that explodes when walked",
     "Containers are nested and shared so that listing the tensors would take exponentially many "
     "steps (like a 'billion laughs' bomb). A state dict is a plain tree; the file is crafted.",
     "", ""},
    {"expanded or overlapping view", "expanded-view", "a tensor repeats its data far past its size",
     "A tensor is saved as a view that reads its data many times (a stride of 0, as "
     ".expand() makes) and would hold far more elements than its storage: more than 2^24 such "
     "elements are not loaded, so a few bytes cannot ask for gigabytes. Re-save the tensor with "
     ".contiguous() (or .clone()) before torch.save.",
     "", ""},
    {"dict keys set again and again", "repeated-work", "work out of proportion to the file",
     "The pickle sets one large dict key again and again, each time a few bytes, asking for "
     "much more work than its size (a crafted file). torch.save sets each key once; re-save it "
     "with torch.save(model.state_dict(), path).",
     "", ""},
    {"contains itself", "reference-cycle", "an object contains itself",
     "A container holds itself (a reference cycle). A state dict never does; the file is crafted "
     "or was not a state dict.",
     "", ""},
    {"byteorder record", "byteorder", "an unknown byte order",
     "The archive's byteorder record says neither 'little' nor 'big': the file is corrupt or "
     "crafted. Re-save it with torch.save.",
     "", ""},
    {"are both named", "name-collision", "two tensors get the same name",
     "Two tensors' keys join (with '.') to the same name, so they cannot be told apart by name. "
     "Re-save with keys that stay unique when joined with '.'.",
     "", ""},
    {"nest deeper than", "too-deep", "containers nest too deeply",
     "The object tree nests deeper than any real checkpoint (a few levels). Flatten the saved "
     "object, e.g. save model.state_dict() rather than a nested structure.",
     "", ""},
    {"pt pickle: refused:", "pickle-refused", "the pickle does what a state dict never does",
     "The pickle builds something other than tensors, parameters, containers, numbers and "
     "strings, or uses an instruction on the wrong kind of object. torch.save(state_dict) never "
     "writes that; the file was crafted or holds arbitrary Python objects.",
     "", ""},
    {"pt pickle:", "pickle-corrupt", "the pickle stream is malformed",
     "The pickle (data.pkl) is malformed: truncated, unbalanced, or referring to things it never "
     "stored. The file is corrupt or hand-made. Re-save it with torch.save.",
     "", ""},
    {"", "other", "the file was refused",
     "The loader refused the file for the reason above; its message says what to do.", "", ""},
};
static_assert(std::size(kClasses) == 34, "each refusal class of the loader has a row");

// Rows whose advice is "do not torch.load it": the file could run code.
bool could_run_code(std::string_view id) {
  return id == "code-import" || id == "code-hooks" || id == "code-call" || id == "pickle-opcode";
}

}  // namespace

const RefusalClass& classify_refusal(std::string_view message) {
  for (const RefusalClass& c : kClasses)
    if (message.find(c.needle) != std::string_view::npos) return c;
  return kClasses[std::size(kClasses) - 1];  // unreachable: the last needle is empty
}

std::string explain_refusal(const RefusalClass& c, std::string_view message) {
  std::string detail = "something";
  if (!c.detail_from.empty()) {
    if (auto a = message.find(c.detail_from); a != std::string_view::npos) {
      a += c.detail_from.size();
      const auto b = message.find(c.detail_to, a);
      detail = std::string(message.substr(a, b == std::string_view::npos ? b : b - a));
    }
  }
  std::string out(c.explanation);
  if (auto at = out.find("{}"); at != std::string::npos) out.replace(at, 2, detail);
  if (could_run_code(c.id)) {
    out += ' ';
    out += kResaveTrusted;
  }
  return out;
}

}  // namespace crucible::cli
