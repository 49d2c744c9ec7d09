// ObjectCache.cpp — object files on disk, written atomically, checked on load (ObjectCache.h).
#include "crucible/mimic/ObjectCache.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace crucible::mimic {
namespace {

constexpr char kMagic[8] = {'C', 'R', 'U', 'C', 'K', 'O', 'B', 'J'};
constexpr std::uint32_t kFormat = 1;

void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
bool get_u64(std::string_view& s, std::uint64_t* v) {
  if (s.size() < 8) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i) *v |= std::uint64_t{static_cast<unsigned char>(s[i])} << (8 * i);
  s.remove_prefix(8);
  return true;
}

// The whole entry as it goes to disk.
std::string encode(const CpuKernelKey& key, const std::string& object) {
  std::string s(kMagic, sizeof kMagic);
  put_u64(s, kFormat);
  put_u64(s, key.text.size());
  s += key.text;
  const ContentHash sum = content_hash(object);
  put_u64(s, object.size());
  put_u64(s, sum.lo);
  put_u64(s, sum.hi);
  s += object;
  return s;
}

}  // namespace

std::string default_cache_dir() {
  if (const char* d = std::getenv("CRUCIBLE_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return std::string(x) + "/crucible";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::string(h) + "/.cache/crucible";
  return {};
}

Result<ObjectCache> ObjectCache::open(std::string dir) {
  if (dir.empty())
    return invalid_input("no kernel cache directory",
                         "set CRUCIBLE_CACHE_DIR (or HOME), or turn the disk cache off");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return invalid_input("cannot make the kernel cache directory " + dir + ": " + ec.message(),
                         "set CRUCIBLE_CACHE_DIR to a writable directory");
  return ObjectCache(std::move(dir));
}

std::string ObjectCache::path_of(const CpuKernelKey& key) const {
  return dir_ + "/" + key.hash.hex() + ".cko";
}

ObjectCache::Loaded ObjectCache::load(const CpuKernelKey& key, const CpuTarget& host) const {
  Loaded r;
  const std::string path = path_of(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return r;  // Miss
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string_view s = file;
  auto reject = [&](std::string why) {
    std::remove(path.c_str());
    r.outcome = Outcome::Rejected;
    r.why = path + ": " + std::move(why);
    return r;
  };
  std::uint64_t format = 0, key_len = 0;
  if (s.size() < sizeof kMagic || std::memcmp(s.data(), kMagic, sizeof kMagic) != 0)
    return reject("not a kernel cache entry (bad magic)");
  s.remove_prefix(sizeof kMagic);
  if (!get_u64(s, &format) || format != kFormat)
    return reject("format " + std::to_string(format) + ", not " + std::to_string(kFormat));
  if (!get_u64(s, &key_len) || key_len > s.size()) return reject("truncated in its key");
  const std::string_view text = s.substr(0, key_len);
  s.remove_prefix(key_len);
  if (!runs_on(key_features(text), host)) return reject("built for CPU features this CPU lacks");
  if (text != key.text) return reject("holds another key");
  std::uint64_t body_len = 0;
  ContentHash sum;
  if (!get_u64(s, &body_len) || !get_u64(s, &sum.lo) || !get_u64(s, &sum.hi))
    return reject("truncated in its header");
  if (body_len != s.size())
    return reject("body of " + std::to_string(s.size()) + " bytes, the header says " +
                  std::to_string(body_len));
  if (content_hash(s) != sum) return reject("body checksum mismatch");
  r.outcome = Outcome::Hit;
  r.object.assign(s.data(), s.size());
  return r;
}

Status ObjectCache::store(const CpuKernelKey& key, const std::string& object) const {
  const std::string entry = encode(key, object);
  static std::atomic<std::uint64_t> counter{0};
  const std::string tmp = dir_ + "/." + key.hash.hex() + "." + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1)) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("open " + tmp, errno);
  std::size_t done = 0;
  while (done < entry.size()) {
    const ssize_t w = ::write(fd, entry.data() + done, entry.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      return os_error("write " + tmp, e);
    }
    done += static_cast<std::size_t>(w);
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return os_error("close " + tmp, e);
  }
  if (::rename(tmp.c_str(), path_of(key).c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return os_error("rename " + tmp + " to " + path_of(key), e);
  }
  return ok_status();
}

}  // namespace crucible::mimic
