// device_training.cpp compiled by nvcc (a CUDA build): the stages' kernels on the GPU.
#include "device_training.cpp"
