// The subcommands besides the benchmark run. Each takes the whole argv (argv[1] is its name) and
// returns the exit code; usage errors throw UsageError.
#pragma once

namespace stepbench::cli {

// stepbench check: run given weights and input; write logits, loss and gradients (safetensors).
int check_main(int argc, char** argv);
// stepbench make-dataset DIR: write a synthetic JPEG or PNG folder for --data DIR.
int make_dataset_main(int argc, char** argv);
// stepbench make-records DIR OUT: the folder decoded and resized once into a record file for --data OUT.
int make_records_main(int argc, char** argv);
// stepbench compare BASE.json HEAD.json: the regression gate (exit 1 on a regression).
int compare_main(int argc, char** argv);
// stepbench launch --nproc N -- ARGS: N processes of a run on this node, as torchrun starts them.
int launch_main(int argc, char** argv);

}  // namespace stepbench::cli
