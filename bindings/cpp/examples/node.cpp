// One rendezvous node: joins one round, publishes "cpp" under node/<rank>, reads every rank's
// value, prints one JSON line and exits 0. On a rendezvous error it prints a JSON line with
// "error" and exits 2; on bad usage it exits 64.
//
//   rdzv_node 'etcd://127.0.0.1:2379/my-run?min_nodes=2&max_nodes=2'
#include <rdzv/rdzv.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string json_string(const std::string& s) {
  std::ostringstream out;
  out << '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\r': out << "\\r"; break;
      case '\t': out << "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out << buf;
        } else {
          out << c;
        }
    }
  }
  out << '"';
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " URL\n";
    return 64;
  }
  try {
    rdzv::Rendezvous node(rdzv::Params::from_url(argv[1]));
    auto [info, store] = node.next();
    store.set("node/" + std::to_string(info.rank), "cpp");
    std::vector<std::string> keys;
    for (uint32_t r = 0; r < info.world_size; ++r) keys.push_back("node/" + std::to_string(r));
    const auto peers = store.multi_get(keys, std::chrono::seconds(60));

    std::ostringstream line;
    line << "{\"lang\":\"cpp\",\"rank\":" << info.rank << ",\"world_size\":" << info.world_size
         << ",\"round\":" << info.round << ",\"peers\":[";
    for (size_t i = 0; i < peers.size(); ++i) line << (i ? "," : "") << json_string(peers[i]);
    line << "]}";
    std::cout << line.str() << std::endl;
    node.shutdown();
    return 0;
  } catch (const rdzv::Error& e) {
    std::cout << "{\"lang\":\"cpp\",\"error\":" << json_string(rdzv::status_name(e.status()))
              << ",\"message\":" << json_string(e.message()) << "}" << std::endl;
    return 2;
  }
}
