// README's example: the reader's own compute_gradients is declared, not defined (compiled only).
#include <span>

void compute_gradients(std::span<double> weights, std::span<double> grads);

// @block@
