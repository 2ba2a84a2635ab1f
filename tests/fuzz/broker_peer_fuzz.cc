// Fuzz target: the broker driver (tests/fuzz/broker_driver.h) across nodes: kvpoold is node a,
// and the input also plays its peer node b, which moves sequences here, takes moves from here and
// answers them, honestly or not. Every byte b sends is a peer's, so none of it may break a pool.
#include "tests/fuzz/broker_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvp::fuzz::FuzzInput in(data, size);
  // Moves to other nodes are paired socket moves; within the node, odd lengths take them too.
  kvp::fuzz::Driver driver(
      in, size % 2 == 1 ? std::optional(kvp::wire::Transport::SOCKET) : std::nullopt,
      /*peers=*/true);
  for (int step = 0; step < 200 && !in.done(); ++step) driver.Step();
  driver.Finish();
  return 0;
}
