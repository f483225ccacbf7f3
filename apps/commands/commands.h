// commands.h: the table of qshard's subcommands. Subcommands (in the order `qshard --help` lists them):
//   version                         build and backend information
//   quantize IN_DIR OUT_DIR [--device auto|cpu|cuda]
//                                   HF Llama folder -> bitsandbytes 4-bit folder
//   dequantize IN_DIR OUT_DIR       bitsandbytes 4-bit folder -> float folder (each weight in the
//                                   dtype it was quantized from, or --dtype)
//   init-model --out DIR [sizes]    a random tiny Llama as a Hugging Face folder
//   inspect PATH [--check]          keys, dtypes, shapes, bytes and the node each key resolves to;
//                                   a token file: its counts and the tokenizer that made it
//   tokenize IN... --out FILE       text / jsonl -> token file with the byte-level tokenizer
//   train --config FILE [--set k=v] [--resume auto|PATH] [--print-config]
//                                   the QLoRA training job (run under mpirun for several ranks)
//   train --describe-config         every config key as markdown (docs/CONFIG.md)
//   export CKPT --format bnb4|peft|merged --out DIR
//                                   a training checkpoint as a Hugging Face / PEFT folder
//   bench [--preset 8b] [--batch B --seq-len T --rank R] [--offload] [--gpu-budget-gb G] [--json F]
//                                   training speed and memory on a random Llama-shaped model
//   eval --model DIR [--adapter DIR] --data FILE [--dump-logits FILE]   loss and perplexity
//   generate --model DIR [--adapter DIR] --prompt TEXT [--chat] [--max-new-tokens N]
//            [--temperature T --top-k K --top-p P --seed S]   text from a model, streamed
//
// What:
//   Command      one subcommand: its name and help line (what `qshard --help` lists) and attach(),
//                which declares the subcommand's options on the CLI11 subcommand `sub`, bound to
//                a fresh options struct of that command, and returns the run step that owns it.
//   CommandMain  a command's run step, called once, after a parse that chose the command, with
//                the process's argc/argv (run_job, the MPI main of train / export / bench, takes
//                them). Returns the exit code; 0 success.
//   kCommands    the table; apps/qshard.cpp adds each entry as a subcommand and runs the parsed one.
//   attach_with  the glue one command file uses: its options struct Args, add(sub, args) declaring
//                the options, run(args, argc, argv) doing the work.
// Each command's options, their declaration and its run step live in one file of apps/commands/:
// model_folders.cpp (quantize, dequantize, init-model, inspect), data.cpp (tokenize), train.cpp
// (train, export, bench), infer.cpp (eval, generate), version.cpp (version).
// Exit codes: 0 success, 2 bad input (the message names the file, key or value), 1 other errors
// (inspect --check: 3 when a key does not resolve or a tensor fails validation). A run step throws
// qshard::InputError for bad input and any other exception for other errors; main() turns them
// into 2 and 1. train / export / bench run their work under run_job (runtime/failure.h), whose
// abort path ends the whole job with the same codes on every rank instead of a hang.
// Help: every command's --help shows each option's default and ends with an "Example:" footer
// (help_format.h; tests/apps/help_check.sh). One thing has one flag name in every command
// (--device, --seq-len, --vocab-size / --hidden-size / --intermediate-size, --out,
// --max-shard-size-gb); an older name stays as a hidden alias (bench --seq / --vocab / --hidden /
// --intermediate, quantize --cpu, export --max-shard-size) so scripts keep working.
// Ownership: the run step returned by attach() owns the options struct CLI11 writes into; keep it
// alive until the parse is done and the step has run.
// Thread safety: none; the main thread parses and runs.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

namespace qshard::cli {

using CommandMain = std::function<int(int argc, char** argv)>;

struct Command {
  const char* name;
  const char* help;
  CommandMain (*attach)(CLI::App& sub);
};

template <class Args>
CommandMain attach_with(CLI::App& sub, void (*add)(CLI::App& sub, Args& args),
                        int (*run)(Args& args, int argc, char** argv)) {
  auto args = std::make_shared<Args>();
  add(sub, *args);
  return [args, run](int argc, char** argv) { return run(*args, argc, argv); };
}

// One per command, defined in the files named above.
CommandMain attach_version(CLI::App& sub);
CommandMain attach_quantize(CLI::App& sub);
CommandMain attach_dequantize(CLI::App& sub);
CommandMain attach_init_model(CLI::App& sub);
CommandMain attach_inspect(CLI::App& sub);
CommandMain attach_tokenize(CLI::App& sub);
CommandMain attach_train(CLI::App& sub);
CommandMain attach_export(CLI::App& sub);
CommandMain attach_bench(CLI::App& sub);
CommandMain attach_eval(CLI::App& sub);
CommandMain attach_generate(CLI::App& sub);

inline constexpr Command kCommands[] = {
    {"version", "print version and backends", attach_version},
    {"quantize", "quantize a Hugging Face Llama folder to bitsandbytes 4-bit", attach_quantize},
    {"dequantize", "dequantize a bitsandbytes 4-bit folder", attach_dequantize},
    {"init-model", "write a randomly initialised Llama as a Hugging Face folder", attach_init_model},
    {"inspect", "list a safetensors file or model folder, resolving every key", attach_inspect},
    {"tokenize", "tokenize text or jsonl files (the byte-level tokenizer, or --tokenizer)", attach_tokenize},
    {"train", "run a QLoRA training job (mpirun -np N for N ranks)", attach_train},
    {"export", "export a training checkpoint (mpirun -np N works too)", attach_export},
    {"bench",
     "tokens/s, MFU, memory and time split of QLoRA steps on a random "
     "Llama-shaped NF4 model (mpirun -np N for N ranks)",
     attach_bench},
    {"eval", "loss and perplexity of a model folder (+ PEFT adapter) on token data", attach_eval},
    {"generate", "text from a model folder (+ PEFT adapter), streamed as it comes", attach_generate},
};

}  // namespace qshard::cli
