#include "spec/rejection.h"

#include <algorithm>

namespace dsv41::spec {

Verdict accept_or_resample(const sched::TokenDistribution& p, const sched::TokenDistribution& q, int32_t d,
                           const std::function<double()>& uniform) {
  if (p.ids.size() == 1) return Verdict{d == p.ids.front(), p.ids.front()};
  const double pd = p.prob(d), qd = q.prob(d);
  // u < p/q written without the division (q(d) > 0 for a draft drawn from q; a zero q(d) can
  // only come from a caller bug and is treated as a rejection).
  if (qd > 0.0 && uniform() * qd < pd) return Verdict{true, d};

  // Residual max(p − q, 0) over p's candidates (outside them p is 0 and so is the residual).
  // q by id (dense: a whole-vocabulary q has ~129k candidates; absent ids have probability 0).
  int32_t max_id = 0;
  for (int32_t id : q.ids) max_id = std::max(max_id, id);
  std::vector<double> qprob(static_cast<size_t>(max_id) + 1, 0.0);
  for (size_t i = 0; i < q.ids.size(); ++i)
    if (q.ids[i] >= 0) qprob[static_cast<size_t>(q.ids[i])] = q.total > 0.0 ? q.weights[i] / q.total : 0.0;
  std::vector<double> r(p.ids.size());
  double sum = 0.0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const int32_t id = p.ids[i];
    const double pi = p.weights[i] / p.total, qi = id >= 0 && id <= max_id ? qprob[static_cast<size_t>(id)] : 0.0;
    sum += r[i] = std::max(pi - qi, 0.0);
  }
  const double u = uniform();
  if (!(sum > 0.0)) return Verdict{false, p.pick(u)};  // p == q up to rounding: rejection is ~never taken
  const double x = u * sum;
  double c = 0.0;
  for (size_t i = 0; i < r.size(); ++i) {
    c += r[i];
    if (x < c && r[i] > 0.0) return Verdict{false, p.ids[i]};
  }
  // Rounding at the top end: the last candidate with residual mass.
  for (size_t i = r.size(); i-- > 0;)
    if (r[i] > 0.0) return Verdict{false, p.ids[i]};
  return Verdict{false, p.ids.front()};
}

}  // namespace dsv41::spec
