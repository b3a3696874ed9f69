// The whole graph again in double precision, layer by layer from the graph's own input, labels and
// parameters (read back once), with a first-order bound on how far a correct backend's loss,
// logits and parameter gradients may be from it: each op's own rounding under the error model
// (error_model.hpp) plus the errors it inherits, carried forward through the activations and back
// through the gradients with the oracle on absolute values, as error_model.hpp does for one op.
//
// How inherited errors combine in a sum: where the coefficients have either sign and no relation
// to the errors (the weights of a convolution or the FC, x - mean in a variance, xhat), in
// quadrature (sqrt of the sum of squares), as independent roundings do; where the coefficients
// have one sign (a batch norm mean, the sum of a gradient over a channel, a filter gradient summed
// against ReLU outputs), linearly, because neighbouring elements' errors come from the same
// upstream roundings and such a sum adds them up. (With quadrature there too, three towers of the
// tiny model exceeded their bounds 7x after two steps: Towers.NTowersEndWhereTheOracleStepsEnd.)
//
// expect_units_match_oracle checks each unit from the graph's own (already rounded) inputs; this
// checks the network end to end, so a fault anywhere in it shows in the loss or some gradient.
//
// Where rounding can flip a discrete choice (a ReLU's input within its error of zero, a residual
// addition's sum within its error of zero, two max-pool inputs within their errors of each other),
// the bound allows either outcome. The bounds compound through every batch norm (about 4x each, worst
// case): they stay useful for a few layers (graph_test's nets), not through ResNet-50's 53. Dropout is not
// modelled (throws): build the graph without it. Inference (training = false) uses the running
// statistics the graph held when the oracle was made, and skips training-only layers.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "support/error_model.hpp"

namespace stepbench::test {

class ChainOracle {
 public:
  explicit ChainOracle(Graph& g);  // reads the structure, input, labels and parameters

  // Trainable parameters by name in PyTorch's order (OIHW filters); tests may change them.
  std::map<std::string, Vec> params;
  // Bounds on errors already in the parameters (after optimizer steps); missing: exact.
  std::map<std::string, Vec> param_bounds;
  // Batch norm running statistics by name (inference).
  std::map<std::string, Vec> state;
  // Another batch: images N x C x H x W as the graph stores them (already in its dtype), labels.
  void set_batch(Vec nchw, std::vector<std::int32_t> labels);

  struct Result {
    double loss = 0, loss_bound = 0;
    std::map<std::string, Vec> logits, logits_bound;  // by output name, N x M
    std::map<std::string, Vec> grads, grad_bounds;    // by parameter name, of the unscaled loss
    std::map<ValueId, Vec> values, value_bounds;      // every layer output (NCHW), and their gradients
    std::map<ValueId, Vec> value_grads, value_grad_bounds;
  };
  Result run(const ErrorModel& m, bool backward = true, bool training = true) const;
  double loss() const { return run(ErrorModel{}, false).loss; }

 private:
  struct Fwd;
  std::vector<LayerInfo> layers_;
  std::map<ValueId, Shape> shapes_;
  std::map<ValueId, std::vector<ValueId>> parts_;  // concats
  ValueId input_ = -1;
  Vec image_;
  std::vector<std::int32_t> labels_;
  DType dtype_ = DType::f32;
};

// The graph's parameters and their gradients (divided by the loss scale), named and ordered as
// ChainOracle's.
std::map<std::string, Vec> graph_params(Graph& g);
std::map<std::string, Vec> graph_grads(Graph& g);

// `steps` optimizer steps (sgd or momentum) in double on one batch, from the oracle's parameters:
// the parameters after them, with bounds that add each step's gradient bound (computed from
// parameters that already carry the earlier steps' bounds) and the update's fp32 rounding.
struct OracleSteps {
  std::map<std::string, Vec> params, bounds;
  std::vector<std::map<std::string, Vec>> after;  // the parameters after each step (after.back() = params)
};
OracleSteps oracle_steps(ChainOracle o, const OptimizerConfig& c, int steps, const ErrorModel& m);
// The same for towers that each see their own batch (one oracle per tower, all with the same
// parameters) and average their gradients before every update.
OracleSteps oracle_steps(std::vector<ChainOracle> towers, const OptimizerConfig& c, int steps, const ErrorModel& m);

// Every parameter of the graph within the bounds of `want` (for EXPECT_TRUE).
testing::AssertionResult params_within(Graph& g, const OracleSteps& want);

// The error model's bounds are worst cases compounded through every batch norm, max pool and ReLU:
// after two steps of the tiny model they are 1e5 to 1e9 times the differences a correct backend
// shows, wide enough to pass a missing step or summed gradients. A measured yardstick instead: the
// same steps in double from parameters each moved by a relative rounding (uniform in [-u, u],
// seeded), per parameter tensor the 2-norm of how far that moves where the steps end. A correct
// fp32 step lands under 5 yardsticks from the oracle (tiny model, 2 and 3 towers, 2 steps, oneDNN's
// default and SSE4.1 kernels); a missing step or summed gradients 1e3 to 5e7 away.
std::map<std::string, double> rounding_yardstick(std::vector<ChainOracle> towers, const OptimizerConfig& c, int steps,
                                                 const OracleSteps& want, double u, std::uint32_t seed);
// Per parameter tensor, how many yardsticks `got` lies from `to` (the 2-norm of the difference).
std::map<std::string, double> yardsticks_apart(const std::map<std::string, Vec>& got,
                                               const std::map<std::string, Vec>& to,
                                               const std::map<std::string, double>& yardstick);
// Every parameter tensor of the graph within k yardsticks of `to`.
testing::AssertionResult params_near(Graph& g, const std::map<std::string, Vec>& to,
                                     const std::map<std::string, double>& yardstick, double k);
testing::AssertionResult params_near(const std::map<std::string, Vec>& got, const std::map<std::string, Vec>& to,
                                     const std::map<std::string, double>& yardstick, double k);

}  // namespace stepbench::test
