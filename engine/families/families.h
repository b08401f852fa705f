// The families flexh2o converts (one file each in this folder).
#pragma once
#include "engine/families/family.h"

namespace flexh2o::engine {

extern const Family kOptFamily;
extern const Family kLlamaFamily;
extern const Family kMistralFamily;
extern const Family kQwen2Family;
extern const Family kQwen3Family;
extern const Family kPhi3Family;
extern const Family kGemma2Family;
extern const Family kMixtralFamily;
extern const Family kQwen2MoeFamily;
extern const Family kQwen3MoeFamily;

}  // namespace flexh2o::engine
