// Fuzz target: the broker driver (tests/fuzz/broker_driver.h) across nodes: kvpoold is node a,
// and the input also plays its peer node b, which moves sequences here, takes moves from here and
// answers them, honestly or not. Every byte b sends is a peer's, so none of it may break a pool.
#include "tests/fuzz/broker_driver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvp::fuzz::RunBrokerDriver(data, size, /*peers=*/true);
}
