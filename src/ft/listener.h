// The supervisor's end of the heartbeat transport (dist/ft_protocol.h): a TCP listener that
// accepts the ranks' connections and splits what they write into newline-terminated JSON
// messages, with poll() over the listening socket and every connection, so one thread watches any
// number of ranks. The supervisor never writes. A line longer than kMaxLine or one that is not
// JSON is reported and skipped (ranks' messages are input). Not here: what a message means
// (ft/monitor.h).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace zaya::ft {

struct Incoming {
  int conn = -1;  // a connection id, unique for the listener's lifetime
  std::optional<nlohmann::json> message;
  bool closed = false;  // the peer closed the connection (after any messages before it)
  std::string error;    // a line that was skipped, and why
};

class Listener {
 public:
  static constexpr size_t kMaxLine = 1 << 20;

  // Binds "HOST:PORT" (HOST an address or name, "0.0.0.0" for every interface; PORT 0 for an
  // ephemeral one); throws zaya::Error naming the address when it cannot.
  explicit Listener(const std::string& listen);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }
  // Waits up to timeout_ms for connections and data; returns the messages and closes seen.
  std::vector<Incoming> poll(int timeout_ms);
  // Closes every connection (between attempts: a late message of an old attempt is not read).
  void close_all();
  size_t connections() const { return conns_.size(); }

 private:
  struct Conn {
    int fd = -1;
    int id = 0;
    std::string buf;
    bool skipping = false;  // inside an over-long line
  };
  void read_conn(Conn& c, std::vector<Incoming>& out);

  int fd_ = -1;
  int port_ = 0;
  int next_id_ = 0;
  std::vector<Conn> conns_;
};

// The host's name (gethostname).
std::string host_name();
// An address of this host that other nodes can reach: the first non-loopback IPv4 address the
// host name resolves to, else 127.0.0.1.
std::string default_advertise_host();

}  // namespace zaya::ft
