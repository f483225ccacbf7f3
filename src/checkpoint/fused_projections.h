// fused_projections.h: Phi-3's fused projections in the files, qshard's separate ones in the model.
//
// What: Phi3ForCausalLM stores q, k and v as one Linear, self_attn.qkv_proj [(H + 2 KV) D, C] (rows:
// the H*D of q, then the KV*D of k, then those of v), and gate and up as mlp.gate_up_proj [2 I, C]
// (rows: gate, then up; the MLP computes silu(gate) * up, Llama's SwiGLU). qshard's module tree and
// model keep Llama's separate q_proj / k_proj / v_proj and gate_proj / up_proj, so everything past
// the loader (sharding, binding, the CPU and CUDA passes) is the Llama skeleton. The loader splits a
// fused weight by rows; every export fuses the parts again (bnb 4-bit, merged, PEFT).
// Legend: C hidden, H heads, KV key/value heads, D head dim, I intermediate, r LoRA rank, n parts.
//
// 4-bit weights (bitsandbytes blockwise, shared/FORMATS.md) split and fuse without requantizing:
// a part of rows [r0, r0 + rows) is the fused tensor's flat elements [e0, e0 + n), e0 = r0 * C. Its
// packed codes are bytes [e0 / 2, (e0 + n + 1) / 2) (REQUIRES e0 even: a part never starts inside a
// byte). Its absmax entries are the fused ones of the blocks it covers; where a part does not start
// at a block boundary, the part takes a smaller block size that does divide e0 (the largest power
// of two dividing both the fused block size and e0) and repeats each fused absmax entry for the
// sub-blocks inside that block: each element still multiplies by its own block's absmax, bit for
// bit. Double quantization: the absmax codes split the same way, and the nested absmax (one f32 per
// nested block of 256 absmax entries) is re-indexed the same way: the part's nested block size is
// the largest power of two (in elements: dividing the fused nested span and e0) such that each of
// its nested blocks lies inside one fused nested block; the quant maps and the offset are the fused
// ones. Dequantizing a part gives exactly the fused tensor's rows (same codes, same f32 absmax
// arithmetic). Real Phi-3 shapes (C a multiple of 64) split at block and nested-block boundaries:
// the parts keep blocksize 64 and nested blocksize 256; tiny test shapes exercise the other case.
// Fusing is the inverse: the first part's block sizes are the fused ones (it starts at e0 = 0), the
// packed bytes concatenate, each fused block's (nested) absmax is read from the part blocks that
// cover it, which must all agree; parts that were not split from one tensor (another quant type,
// dtype, quant map, offset, or block statistics that disagree) are an InputError naming the weight:
// fusing them would need a requantization.
//
// LoRA (PEFT names, docs/FORMATS_NOTES.md): users name Phi-3's targets as PEFT does (qkv_proj,
// gate_up_proj, o_proj, down_proj); the tree's adapters are per part. Export: the n rank-r
// adapters of a fused group become one PEFT adapter of rank n*r, A = [A_1; ...; A_n] [n r, C],
// B block-diagonal [rows, n r], with adapter_config.json's rank_pattern n*r and alpha_pattern
// n*alpha (rsLoRA: alpha*sqrt(n)), so each part's delta and scaling are what qshard trained. Load:
// a fused adapter of the tree's rank (PEFT's own: one A shared by the parts) gives every part that
// A and its rows of B; one of rank n*r whose B is block-diagonal (qshard's export) gives part i its
// own rank-r block; any other rank is refused (qshard holds one rank for every projection).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "quant/params4bit.h"

namespace qshard {

struct FusedProjection {
  std::string fused;               // layer-relative: "self_attn.qkv_proj", "mlp.gate_up_proj"
  std::vector<std::string> parts;  // "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"
  std::vector<int64_t> rows;       // rows of each part, in order
  std::string short_name() const;  // "qkv_proj", "gate_up_proj" (PEFT's target name)
  int64_t total_rows() const;
};

// The fused projections of the config's family: Phi-3's two, none for the other families.
std::vector<FusedProjection> fused_projections(const LlamaConfig& c);

// A tree key under a part's module ("model.layers.3.self_attn.k_proj" + `rest`, rest being
// ".weight", ".weight.absmax", ".lora_A.weight", ...): its group, part index and the fused module
// path ("model.layers.3.self_attn.qkv_proj"). nullopt for keys outside every part.
struct FusedPartRef {
  const FusedProjection* proj = nullptr;
  size_t index = 0;
  int64_t row0 = 0;            // first row of the part in the fused weight
  std::string fused_path;      // "model.layers.<l>.<fused>"
  std::string part_path;       // "model.layers.<l>.<part>"
  std::string rest;            // what follows the part's module path in the key
};
std::optional<FusedPartRef> fused_part_of(const std::vector<FusedProjection>& fused, const std::string& key);

// Rows [row0, row0 + rows) of a 2-D host tensor, copied (same dtype).
Tensor take_rows(const Tensor& t, int64_t row0, int64_t rows);
// The 2-D host tensors stacked by rows (same dtype and columns).
Tensor concat_rows(const std::vector<Tensor>& parts);

// The parts of a 2-D 4-bit weight `fused` (host tensors) of rows `rows` (summing to its rows),
// exactly as described above. `label` names the weight in errors (a shape that does not split, a
// part starting inside a packed byte).
std::vector<Params4bit> split_params4bit(const Params4bit& fused, const std::vector<int64_t>& rows,
                                         const std::string& label);
// The inverse (parts on the host, in row order): the fused weight's scalars only (tensors left
// undefined), for planning sizes and the packed JSON; and the whole fused Params4bit. InputError
// naming `label` where the parts cannot be fused exactly.
QuantState fused_quant_state_scalars(const std::vector<const QuantState*>& parts, const std::string& label);
Params4bit fuse_params4bit(const std::vector<Params4bit>& parts, const std::string& label);

// The tree's LoRA targets (part names) for a job's or adapter's targets named as PEFT names them
// for this family: Phi-3's "qkv_proj" -> q_proj, k_proj, v_proj and "gate_up_proj" -> gate_proj,
// up_proj; other names unchanged. A fused group's part name in a Phi-3 config ("q_proj": Phi-3 has
// no such module) or a fused name in another family is an InputError naming `label`, the name and
// the family's names.
std::vector<std::string> tree_lora_targets(const LlamaConfig& c, const std::vector<std::string>& targets,
                                           const std::string& label);

}  // namespace qshard
