// Cap'n Proto lists to and from std::vector (capnp's iterators are not standard iterators).
#pragma once

#include <vector>

namespace kvp {

template <typename T, typename ListReader>
std::vector<T> ListToVector(ListReader list) {
  std::vector<T> out;
  out.reserve(list.size());
  for (auto v : list) out.push_back(static_cast<T>(v));
  return out;
}

template <typename ListBuilder, typename Values>
void FillList(ListBuilder out, const Values& values) {
  for (size_t i = 0; i < values.size(); ++i) out.set(i, values[i]);
}

}  // namespace kvp
