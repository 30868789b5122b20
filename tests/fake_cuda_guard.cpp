// The native half of tests/fake_cuda.py: a CUDA device guard and CUDA hooks for a CPU-only torch (test-only).
//
// A CPU-only torch has no device guard for CUDA, so autograd aborts on the first tensor that says it lives on
// "cuda" ("PyTorch is not linked with support for cuda devices"), and its backward refuses to start ("Cannot
// access accelerator device when none is available"). This library supplies both, doing nothing: one device, one
// stream, events that are always complete. The hooks answer "CUDA present" only while fake_cuda_enable(1) is in
// force, and torch reads its hooks once, at import: load this library before `import torch`.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>

namespace {
std::atomic<bool> enabled{false};

struct Guard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(c10::DeviceType::CUDA, 0); }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::CUDA, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};
}  // namespace

namespace at {
struct FakeCUDAHooks final : public CUDAHooksInterface {
  explicit FakeCUDAHooks(CUDAHooksArgs) {}
  bool hasCUDA() const override { return enabled.load(); }
  bool isAvailable() const override { return enabled.load(); }
  bool isBuilt() const override { return enabled.load(); }
  bool hasPrimaryContext(DeviceIndex) const override { return enabled.load(); }
  DeviceIndex deviceCount() const override { return enabled.load() ? 1 : 0; }
  int getNumGPUs() const override { return enabled.load() ? 1 : 0; }
  DeviceIndex getCurrentDevice() const override { return 0; }
  DeviceIndex current_device() const override { return 0; }
  void setCurrentDevice(DeviceIndex) const override {}
  DeviceIndex exchangeDevice(DeviceIndex) const override { return 0; }
  DeviceIndex maybeExchangeDevice(DeviceIndex) const override { return 0; }
  void deviceSynchronize(DeviceIndex) const override {}
};
// the key the real CUDA build registers under (REGISTER_CUDA_HOOKS would use the class name)
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", FakeCUDAHooks);
}  // namespace at

C10_REGISTER_GUARD_IMPL(CUDA, Guard);

extern "C" void fake_cuda_enable(int on) { enabled.store(on != 0); }
extern "C" int fake_cuda_live() { return at::detail::getCUDAHooks().hasCUDA() ? 1 : 0; }
