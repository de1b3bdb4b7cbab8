// Defaults of the Model interface's pooled-state hooks: a backend that does not implement them
// cannot be served (the scheduler draws every sequence state from its pool), and says so by name.
#include "dsv41/model/model.h"

#include "dsv41/common/error.h"

namespace dsv41 {

std::unique_ptr<SeqState> Model::new_sequence(std::pmr::memory_resource&, int64_t) const {
  fail("this model backend cannot allocate sequence state from the server's state pool");
}

void Model::reserve_sequence(SeqState&, int64_t) const {
  fail("this model backend cannot grow pooled sequence state");
}

int64_t Model::state_bytes(int64_t) const {
  fail("this model backend does not report its sequence-state size");
}

}  // namespace dsv41
