// Fuzz target: the broker driver (tests/fuzz/broker_driver.h) on one node: clients and workers
// of two pools, moves between them by host copies or, for inputs of odd length, paired socket
// moves.
#include "tests/fuzz/broker_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvp::fuzz::FuzzInput in(data, size);
  // Odd lengths move by paired socket moves, so both kinds of move are reached without a byte.
  kvp::fuzz::Driver driver(
      in, size % 2 == 1 ? std::optional(kvp::wire::Transport::SOCKET) : std::nullopt,
      /*peers=*/false);
  for (int step = 0; step < 200 && !in.done(); ++step) driver.Step();
  driver.Finish();
  return 0;
}
