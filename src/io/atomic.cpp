// Atomic file/directory commits and XXH64 file checksums (see atomic.h). POSIX + Linux
// renameat2; every system call is checked and its failure reported with the path and strerror.
#include "io/atomic.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/error.h"

namespace zaya {

namespace fs = std::filesystem;

namespace {

std::string errstr(int e) {
  return std::strerror(e);
}

std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

// Closes a descriptor on scope exit unless released.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void fsync_path(const std::string& path, bool is_dir) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) fail("cannot open {} to fsync it: {}", path, errstr(errno));
  Fd guard(fd);
  // Some file systems refuse fsync on directories (EINVAL); their metadata is then as durable as
  // they make it, and there is nothing more a program can do.
  if (::fsync(fd) != 0 && !(is_dir && (errno == EINVAL || errno == EROFS)))
    fail("fsync of {} failed: {}", path, errstr(errno));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
AtomicFileWriter::AtomicFileWriter(const std::string& path, unsigned mode)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  ZAYA_CHECK(!path.empty(), "AtomicFileWriter: empty path");
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd_ < 0)
    fail("cannot write {}: creating the temporary file {} failed: {}", path_, tmp_, errstr(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  abort();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  ZAYA_CHECK(fd_ >= 0 && !done_, "writing {}: the file was already committed or aborted", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux writes at most 0x7ffff000 bytes per call; the loop also absorbs short writes.
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;
      abort();
      fail("writing {} failed after {} bytes: {}", path_, written_, errstr(e));
    }
    p += w;
    n -= size_t(w);
    written_ += uint64_t(w);
  }
}

void AtomicFileWriter::commit() {
  ZAYA_CHECK(fd_ >= 0 && !done_, "committing {}: the file was already committed or aborted", path_);
  if (::fsync(fd_) != 0) {
    int e = errno;
    abort();
    fail("fsync of {} failed: {}", tmp_, errstr(e));
  }
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {  // NFS and some FUSE file systems report write errors only here
    int e = errno;
    abort();
    fail("closing {} failed: {}", tmp_, errstr(e));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int e = errno;
    abort();
    fail("cannot move {} into place as {}: {}", tmp_, path_, errstr(e));
  }
  done_ = true;
  fsync_dir(parent_of(path_));
}

void AtomicFileWriter::abort() noexcept {
  if (done_) return;
  done_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFileWriter w(path);
  w.write(contents);
  w.commit();
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", path, errstr(errno));
  Fd guard(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("cannot stat {}: {}", path, errstr(errno));
  if (!S_ISREG(st.st_mode)) fail("{} is not a regular file", path);
  std::string out;
  out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("reading {} failed: {}", path, errstr(errno));
    if (r == 0) break;
    out.append(buf, size_t(r));
  }
  return out;
}

void fsync_dir(const std::string& dir) {
  fsync_path(dir, true);
}

void fsync_tree(const std::string& dir) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) fail("cannot list {}: {}", dir, ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail("cannot list {}: {}", dir, ec.message());
    fs::file_status s = it->symlink_status(ec);
    if (ec) fail("cannot stat {}: {}", it->path().string(), ec.message());
    if (fs::is_regular_file(s))
      fsync_path(it->path().string(), false);
    else if (fs::is_directory(s))
      fsync_path(it->path().string(), true);
  }
  if (ec) fail("cannot list {}: {}", dir, ec.message());
  fsync_path(dir, true);
}

// ---------------------------------------------------------------------------------------------
uint64_t xxh64_bytes(const void* data, size_t n) {
  return XXH64(data, n, 0);
}

uint64_t xxh64_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {} to checksum it: {}", path, errstr(errno));
  Fd guard(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> st(XXH64_createState(),
                                                                       XXH64_freeState);
  if (!st || XXH64_reset(st.get(), 0) != XXH_OK) fail("xxh64: cannot allocate a hash state");
  std::vector<char> buf(size_t(4) << 20);
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("reading {} to checksum it failed: {}", path, errstr(errno));
    if (r == 0) break;
    XXH64_update(st.get(), buf.data(), size_t(r));
  }
  return XXH64_digest(st.get());
}

std::string hex64(uint64_t v) {
  return fmt::format("{:016x}", v);
}

// ---------------------------------------------------------------------------------------------
void check_output_dir(const std::string& input, const std::string& out, bool force) {
  ZAYA_CHECK(!out.empty(), "no output directory given");
  std::error_code ec;
  const fs::path in = fs::weakly_canonical(input, ec);
  const fs::path o = fs::weakly_canonical(out, ec);
  const auto within = [](const fs::path& inner, const fs::path& outer) {
    auto i = inner.begin(), e = outer.begin();
    for (; e != outer.end(); ++e, ++i)
      if (i == inner.end() || *i != *e) return false;
    return true;
  };
  ZAYA_CHECK(!within(o, in) && !within(in, o),
             "{}: the output would {} the input {}; choose another --out", out,
             within(o, in) ? "lie inside" : "replace", input);
  const auto st = fs::symlink_status(out, ec);
  if (ec || !fs::exists(st)) return;
  ZAYA_CHECK(fs::is_directory(st), "{}: exists and is not a directory; choose another --out", out);
  ZAYA_CHECK(force,
             "{}: already exists; pass --force to replace it (the old one is removed only once "
             "the new one is complete)",
             out);
}

AtomicDirCommit::AtomicDirCommit(const std::string& final_dir, const std::string& tag) {
  ZAYA_CHECK(!final_dir.empty(), "AtomicDirCommit: empty directory name");
  fs::path p = fs::path(final_dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  std::string name = p.filename().string();
  ZAYA_CHECK(!name.empty() && name != "." && name != "..",
             "AtomicDirCommit: {} does not name a directory that can be created", final_dir);
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  final_ = p.string();
  const bool private_tag = tag.empty();
  staging_ =
      (parent / (".tmp-" + name + "-" + (private_tag ? std::to_string(::getpid()) : tag))).string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) fail("cannot create {} (parent of {}): {}", parent.string(), final_, ec.message());
  if (private_tag) {
    // A leftover of an earlier process that had our pid: nobody else can be using it.
    fs::remove_all(staging_, ec);
    if (ec) fail("cannot remove the stale staging directory {}: {}", staging_, ec.message());
  }
  if (::mkdir(staging_.c_str(), 0755) != 0 && !(errno == EEXIST && !private_tag))
    fail("cannot create the staging directory {} for {}: {}", staging_, final_, errstr(errno));
  // A shared tag's directory belongs to the group of writers; only a private one is ours to
  // delete when this object dies uncommitted.
  done_ = !private_tag;
}

AtomicDirCommit::~AtomicDirCommit() {
  if (!done_) abort();
}

void AtomicDirCommit::abort() noexcept {
  std::error_code ec;
  fs::remove_all(staging_, ec);
  done_ = true;
}

void AtomicDirCommit::commit(IfExists if_exists) {
  std::error_code ec;
  ZAYA_CHECK(fs::is_directory(staging_, ec), "committing {}: the staging directory {} is gone",
             final_, staging_);
  fsync_tree(staging_);
  const std::string parent = parent_of(final_);
  if (if_exists == IfExists::Fail) {
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_NOREPLACE) != 0) {
      int e = errno;
      if (e == EEXIST) fail("cannot commit {}: it already exists", final_);
      if (e != EINVAL) fail("cannot move {} into place as {}: {}", staging_, final_, errstr(e));
      // The file system has no RENAME_NOREPLACE: check, then rename (a small race, documented).
      if (fs::exists(fs::symlink_status(final_, ec)))
        fail("cannot commit {}: it already exists", final_);
      if (::rename(staging_.c_str(), final_.c_str()) != 0)
        fail("cannot move {} into place as {}: {}", staging_, final_, errstr(errno));
    }
  } else {
    if (!fs::exists(fs::symlink_status(final_, ec))) {
      if (::rename(staging_.c_str(), final_.c_str()) != 0)
        fail("cannot move {} into place as {}: {}", staging_, final_, errstr(errno));
    } else if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) ==
               0) {
      // The old directory now sits at the staging name.
      fsync_dir(parent);
      fs::remove_all(staging_, ec);
      if (ec)
        fail("{} was committed, but removing the old copy at {} failed: {}", final_, staging_,
             ec.message());
    } else {
      int e = errno;
      if (e != EINVAL) fail("cannot swap {} into place as {}: {}", staging_, final_, errstr(e));
      // No RENAME_EXCHANGE: move the old one aside first; a reader may briefly find no directory.
      std::string old = staging_ + ".old";
      if (::rename(final_.c_str(), old.c_str()) != 0)
        fail("cannot move the old {} aside: {}", final_, errstr(errno));
      if (::rename(staging_.c_str(), final_.c_str()) != 0) {
        int e2 = errno;
        ::rename(old.c_str(), final_.c_str());
        fail("cannot move {} into place as {}: {}", staging_, final_, errstr(e2));
      }
      fs::remove_all(old, ec);
    }
  }
  done_ = true;
  fsync_dir(parent);
}

}  // namespace zaya
