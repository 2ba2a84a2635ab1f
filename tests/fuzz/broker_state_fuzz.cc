// Fuzz target: the broker driver (tests/fuzz/broker_driver.h) on one node: clients and workers
// of two pools, moves between them by host copies or, for inputs of odd length, paired socket
// moves.
#include "tests/fuzz/broker_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvp::fuzz::RunBrokerDriver(data, size, /*peers=*/false);
}
