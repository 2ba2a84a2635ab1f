#include "protocol/message_check.h"

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <kj/exception.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvp {
namespace {

// The annotations' ids, as kvpool.capnp declares them (message_check_test checks that every List
// field of the schema carries one of them).
constexpr uint64_t kMaxElementsAnnotation = 0xe3c1a1d7b6a05f01ull;
constexpr uint64_t kBoundByAnnotation = 0xe3c1a1d7b6a05f02ull;

uint64_t BoundOf(const capnp::StructSchema::Field& field, const WireLimits& limits) {
  for (auto a : field.getProto().getAnnotations()) {
    if (a.getId() == kMaxElementsAnnotation) return a.getValue().getUint32();
    if (a.getId() == kBoundByAnnotation) {
      switch (static_cast<wire::PoolBound>(a.getValue().getEnum())) {
        case wire::PoolBound::LAYERS:
          return limits.max_layers;
        case wire::PoolBound::BLOCKS:
          return limits.max_blocks;
      }
    }
  }
  return 0;
}

class Checker {
 public:
  explicit Checker(const WireLimits& limits) : limits_(limits) {}

  // Checks `s`; a capnp exception propagates with path() telling where it was thrown.
  absl::Status Struct(capnp::DynamicStruct::Reader s) {
    const capnp::StructSchema schema = s.getSchema();
    for (auto field : schema.getNonUnionFields()) {
      if (absl::Status st = Field(s, field); !st.ok()) return st;
    }
    if (schema.getUnionFields().size() > 0) {
      KJ_IF_MAYBE (member, s.which()) {
        if (absl::Status st = Field(s, *member); !st.ok()) return st;
      } else {
        return Error(absl::StrCat("a union member this schema does not have (",
                                  std::string(schema.getProto().getDisplayName().cStr()), ")"));
      }
    }
    return absl::OkStatus();
  }

  std::string path() const { return path_.empty() ? "envelope" : absl::StrJoin(path_, ""); }

 private:
  absl::Status Field(capnp::DynamicStruct::Reader s, capnp::StructSchema::Field field) {
    const auto proto = field.getProto();
    const capnp::Type type = field.getType();
    const bool pointer = type.isStruct() || type.isList() || type.isText() || type.isData() ||
                         type.isAnyPointer() || type.isInterface();
    if (pointer && !proto.isGroup() && !s.has(field)) return absl::OkStatus();  // default value
    path_.push_back(absl::StrCat(path_.empty() ? "" : ".", proto.getName().cStr()));
    absl::Status st = Value(s.get(field), type, BoundOf(field, limits_));
    if (st.ok()) path_.pop_back();
    return st;
  }

  // `bound`: the field's list bound (0: none named).
  absl::Status Value(capnp::DynamicValue::Reader value, capnp::Type type, uint64_t bound) {
    if (type.isStruct()) return Struct(value.as<capnp::DynamicStruct>());
    if (type.isEnum()) {
      const capnp::DynamicEnum e = value.as<capnp::DynamicEnum>();
      if (e.getEnumerant() == nullptr) {
        return Error(absl::StrCat("value ", e.getRaw(), " is not one of enum ",
                                  std::string(e.getSchema().getShortDisplayName().cStr())));
      }
      return absl::OkStatus();
    }
    if (type.isText()) {
      const size_t size = value.as<capnp::Text>().size();
      if (bound != 0 && size > bound) {
        return Error(absl::StrCat("text of ", size, " bytes; at most ", bound));
      }
      return absl::OkStatus();
    }
    if (type.isData()) {
      value.as<capnp::Data>();  // the pointer's kind
      return absl::OkStatus();
    }
    if (type.isList()) {
      const capnp::DynamicList::Reader list = value.as<capnp::DynamicList>();
      if (bound == 0) return Error("a list field with no bound in the schema");
      if (list.size() > bound) {
        return Error(absl::StrCat("list of ", list.size(), " elements; at most ", bound));
      }
      const capnp::Type element = type.asList().getElementType();
      if (!(element.isStruct() || element.isList() || element.isText() || element.isData() ||
            element.isEnum())) {
        return absl::OkStatus();  // plain numbers: the list read above checked their size
      }
      for (unsigned i = 0; i < list.size(); ++i) {
        path_.push_back(absl::StrCat("[", i, "]"));
        // Nested lists and texts in a list are bounded by the message only.
        absl::Status st = Value(list[i], element, ~uint64_t{0});
        if (!st.ok()) return st;
        path_.pop_back();
      }
      return absl::OkStatus();
    }
    if (type.isAnyPointer() || type.isInterface()) {
      return Error("a field kind kvpool's schema does not use");
    }
    return absl::OkStatus();  // a number or a bool: always readable
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("malformed message at ", path(), ": ", what));
  }

  const WireLimits& limits_;
  std::vector<std::string> path_;
};

}  // namespace

absl::Status CheckEnvelope(wire::Envelope::Reader envelope, const WireLimits& limits) {
  Checker checker(limits);
  absl::Status status;
  kj::Maybe<kj::Exception> failure =
      kj::runCatchingExceptions([&] { status = checker.Struct(capnp::toDynamic(envelope)); });
  KJ_IF_MAYBE (e, failure) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message at ", checker.path(), ": ", e->getDescription().cStr()));
  }
  return status;
}

uint64_t TEST_ListBound(const capnp::StructSchema::Field& field, const WireLimits& limits) {
  return BoundOf(field, limits);
}

}  // namespace kvp
