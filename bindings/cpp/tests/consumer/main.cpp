// Links against the installed rdzv and exercises a call that needs no etcd.
#include <rdzv/rdzv.hpp>

#include <iostream>

int main() {
  rdzv::Params params = rdzv::Params::from_url("etcd://127.0.0.1:2379/consumer?min_nodes=1");
  params.set("max_nodes", "2");
  try {
    params.set("no_such_option", "1");
  } catch (const rdzv::InvalidArgumentError& e) {
    std::cout << "consumer ok: " << e.what() << "\n";
    return 0;
  }
  std::cout << "expected InvalidArgumentError\n";
  return 1;
}
