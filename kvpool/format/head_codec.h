// Encode and decode one token-head vector in any KvFormat: the single entry point the write path,
// the CPU references and kvpool-format share. Host and device.
//
// A vector of d elements becomes DataBytes(d) bytes in the format's data section and
// ScaleBytes(d) bytes in its scale section (TraitsOf). Per format:
//   bf16      data: d little-endian bf16 (round to nearest even)
//   fp8_e4m3  data: E4M3(x / scale); a NaN input keeps its sign (0x7F / 0xFF)
//   turboN    data: packed N-bit codes of the (rotated) groups; scales: E4M3(s / scale) per 16
//   indexer   d = 128; data: E4M3(x / s); scales: s as little-endian float32 (UE8M0 if asked)
#pragma once

#include <cstdint>
#include <cstring>

#include "base/hd.h"
#include "kvpool/format/bf16.h"
#include "kvpool/format/e4m3.h"
#include "kvpool/format/indexer_quant.h"
#include "kvpool/format/kv_format.h"
#include "kvpool/format/rotation.h"
#include "kvpool/format/turbo_quant.h"

namespace kvp {

struct HeadCodec {
  KvFormat format = KvFormat::kBf16;
  float scale = 1.0f;     // k_scale (fp8_e4m3) or v_scale (turboN); unused otherwise
  bool rotate = true;     // turboN: apply the signed Walsh-Hadamard rotation
  bool ue8m0 = true;      // indexer: power-of-two scales
  RotationSigns signs{};  // turboN with rotate: MakeRotationSigns(d)
};

// Calls fn(std::integral_constant<int, N>{}) for turboN; the one place N becomes a constant.
template <typename Fn>
KVP_HD void DispatchTurboBits(KvFormat format, Fn&& fn) {
  switch (format) {
    case KvFormat::kTurbo2:
      fn(IntConstant<2>{});
      break;
    case KvFormat::kTurbo3:
      fn(IntConstant<3>{});
      break;
    case KvFormat::kTurbo4:
      fn(IntConstant<4>{});
      break;
    default:
      break;
  }
}

KVP_HD void EncodeHead(const HeadCodec& c, const float* x, int d, uint8_t* data, uint8_t* scales) {
  switch (c.format) {
    case KvFormat::kBf16:
      for (int i = 0; i < d; ++i) {
        const Bf16 h = Bf16FromFloat(x[i]);
        data[2 * i] = static_cast<uint8_t>(h.bits);
        data[2 * i + 1] = static_cast<uint8_t>(h.bits >> 8);
      }
      return;
    case KvFormat::kFp8E4m3:
      // NaN is encoded before any arithmetic: division would drop its sign on some hardware.
      for (int i = 0; i < d; ++i)
        data[i] = E4m3FromFloat(IsNan(x[i]) ? x[i] : DivRn(x[i], c.scale));
      return;
    case KvFormat::kIndexer: {
      float s;
      IndexerEncode(x, c.ue8m0, data, &s);
      memcpy(scales, &s, sizeof(s));
      return;
    }
    default:
      DispatchTurboBits(c.format, [&](auto bits) {
        TurboEncodeHead<decltype(bits)::value>(x, d, c.rotate, c.signs, c.scale, data, scales);
      });
  }
}

// Decodes to the storage domain: for turboN that is ŷ, the rotated domain; attention kernels
// accumulate there and rotate back once. Other formats have no rotation.
KVP_HD void DecodeHeadStored(const HeadCodec& c, const uint8_t* data, const uint8_t* scales, int d,
                             float* x) {
  switch (c.format) {
    case KvFormat::kBf16:
      for (int i = 0; i < d; ++i) {
        x[i] = Bf16ToFloat(Bf16{static_cast<uint16_t>(data[2 * i] | (data[2 * i + 1] << 8))});
      }
      return;
    case KvFormat::kFp8E4m3:
      for (int i = 0; i < d; ++i) x[i] = MulRn(E4m3ToFloat(data[i]), c.scale);
      return;
    case KvFormat::kIndexer: {
      float s;
      memcpy(&s, scales, sizeof(s));
      IndexerDecode(data, s, x);
      return;
    }
    default:
      DispatchTurboBits(c.format, [&](auto bits) {
        TurboDecodeHeadRotated<decltype(bits)::value>(data, scales, d, c.scale, x);
      });
  }
}

// True when DecodeHeadStored leaves the values rotated and RotateInverse must follow.
KVP_HD bool StoredRotated(const HeadCodec& c) { return TraitsOf(c.format).turbo && c.rotate; }

// Decodes to the value domain.
KVP_HD void DecodeHead(const HeadCodec& c, const uint8_t* data, const uint8_t* scales, int d,
                       float* x) {
  DecodeHeadStored(c, data, scales, d, x);
  if (StoredRotated(c)) RotateInverse(x, d, c.signs);
}

}  // namespace kvp
