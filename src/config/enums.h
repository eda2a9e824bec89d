#pragma once
// Every enumerated value of the input file, for config/ (its schema and rules) and the apps: each
// enum lives in the layer that acts on it, beside its name table (tensor/name_table.h).
#include "ckpt/formats.h"
#include "data/kinds.h"
#include "fsdp/strategy.h"
#include "nn/attention_mode.h"
#include "optim/kinds.h"
#include "tensor/name_table.h"
