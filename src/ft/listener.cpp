#include "ft/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/json.h"

namespace zaya::ft {

Listener::Listener(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  ZAYA_CHECK(colon != std::string::npos, "--listen '{}': expected HOST:PORT", listen);
  const std::string host = listen.substr(0, colon), port = listen.substr(colon + 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
  ZAYA_CHECK(rc == 0, "--listen '{}': {}", listen, gai_strerror(rc));
  fd_ = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool ok =
      fd_ >= 0 && bind(fd_, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd_, 512) == 0;
  const int err = errno;
  freeaddrinfo(res);
  if (!ok) {
    if (fd_ >= 0) ::close(fd_);
    fail("--listen '{}': cannot listen there: {}", listen, std::strerror(err));
  }
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
}

Listener::~Listener() {
  close_all();
  if (fd_ >= 0) ::close(fd_);
}

void Listener::close_all() {
  for (auto& c : conns_) ::close(c.fd);
  conns_.clear();
}

void Listener::read_conn(Conn& c, std::vector<Incoming>& out) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(c.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      ::close(c.fd);
      c.fd = -1;
      Incoming in;
      in.conn = c.id;
      in.closed = true;
      out.push_back(in);
      return;
    }
    size_t b = 0;
    for (size_t i = 0; i < size_t(n); i++) {
      if (buf[i] != '\n') continue;
      if (c.skipping) {
        c.skipping = false;
      } else {
        c.buf.append(buf + b, i - b);
        Incoming in;
        in.conn = c.id;
        try {
          in.message = parse_json(c.buf, "a rank's message");
        } catch (const Error& e) {
          in.error = e.what();
        }
        out.push_back(std::move(in));
      }
      c.buf.clear();
      b = i + 1;
    }
    if (!c.skipping) c.buf.append(buf + b, size_t(n) - b);
    if (c.buf.size() > kMaxLine) {
      Incoming in;
      in.conn = c.id;
      in.error = fmt::format("a rank's message is longer than {} bytes; skipped", kMaxLine);
      out.push_back(in);
      c.buf.clear();
      c.skipping = true;
    }
  }
}

std::vector<Incoming> Listener::poll(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({fd_, POLLIN, 0});
  for (const auto& c : conns_) fds.push_back({c.fd, POLLIN, 0});
  std::vector<Incoming> out;
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n <= 0) return out;
  for (size_t i = 1; i < fds.size(); i++)
    if (fds[i].revents) read_conn(conns_[i - 1], out);
  std::erase_if(conns_, [](const Conn& c) { return c.fd < 0; });
  if (fds[0].revents & POLLIN) {
    for (;;) {
      const int c = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) break;
      conns_.push_back({c, next_id_++, {}, false});
    }
  }
  return out;
}

std::string host_name() {
  char h[256] = {};
  if (gethostname(h, sizeof(h) - 1) != 0) return "localhost";
  return h;
}

std::string default_advertise_host() {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string best = "127.0.0.1";
  if (getaddrinfo(host_name().c_str(), nullptr, &hints, &res) != 0) return best;
  for (addrinfo* a = res; a; a = a->ai_next) {
    char s[INET_ADDRSTRLEN] = {};
    const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    inet_ntop(AF_INET, &sin->sin_addr, s, sizeof(s));
    if ((ntohl(sin->sin_addr.s_addr) >> 24) != 127) {
      best = s;
      break;
    }
  }
  freeaddrinfo(res);
  return best;
}

}  // namespace zaya::ft
