// SpecBackend on the CPU reference engine (src/spec/cpu_backend.cpp).
#pragma once
#include <memory>

#include "dsv41/model/cpu_model.h"
#include "dsv41/spec/spec_backend.h"

namespace dsv41::dist {
class TpModel;
}

namespace dsv41::spec {

// The model must outlive the backend and must have been loaded with its DSpark stages.
std::unique_ptr<SpecBackend> make_cpu_spec_backend(model::CpuModel& model);
// The same on rank 0 of a tensor-parallel run (the CPU engine split over ranks).
std::unique_ptr<SpecBackend> make_cpu_spec_backend(dist::TpModel& model);

}  // namespace dsv41::spec
