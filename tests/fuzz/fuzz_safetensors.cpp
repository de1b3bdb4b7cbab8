// libFuzzer target: the safetensors header parser (SafetensorsFile::from_memory). Any input must
// either parse into bounds-checked tensors or end in one dsv41::Error; anything else (a crash, a
// sanitizer report, another exception type) is a finding.
#include <cstddef>
#include <cstdint>

#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = dsv41::SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    // Touch every accepted tensor: its bytes must lie inside the input.
    uint64_t sum = 0;
    for (const auto& t : f->tensors()) {
      if (t.nbytes > 0) sum += t.data[0] + t.data[t.nbytes - 1];
      if (t.nbytes <= 4096) sum += dsv41::tensor_to_f32(t).size();
      (void)f->find(t.name);
    }
    volatile uint64_t sink = sum;
    (void)sink;
  } catch (const dsv41::Error&) {
  }
  return 0;
}
