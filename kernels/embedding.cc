// Backend::embedding: the ids are checked against the table on the host, for every device.
#include <stdexcept>
#include <string>

#include "kernels/backend.h"

namespace flexh2o::kernels {

void Backend::embedding(const EmbeddingArgs& a) {
  for (const std::int32_t id : a.ids) {
    const std::int64_t row = id + a.offset;
    if (row < 0 || row >= a.table.rows)
      throw std::out_of_range("embedding: id " + std::to_string(id) + " (row " + std::to_string(row) +
                              ") outside a table of " + std::to_string(a.table.rows) + " rows");
  }
  do_embedding(a);
}

}  // namespace flexh2o::kernels
