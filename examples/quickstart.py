"""Quickstart: build a Carryover drafter for a small target, train it briefly, generate with it, print statistics.

    python examples/quickstart.py

Runs offline in about a minute on a CPU. The target is a tiny random Llama-architecture model; the drafter learns
its answers to random prompts (its own "regenerated" data) with `CarryoverTrainer`, first with the DFlash objective,
then with the draft-verify-draft (carryover) objective. With a real model, replace `tiny_target(...)` by
`AutoModelForCausalLM.from_pretrained(...)` and load a trained drafter with
`AutoModel.from_pretrained("org/<target>-carryover-dflash")`.
"""

import tempfile
import time

import torch
from transformers import GenerationConfig

import carryover_hf  # noqa: F401  (registers the drafter and routes generate() to it)
from carryover_hf import CarryoverDrafterConfig, CarryoverDrafterModel
from carryover_hf.tools.tiny import tiny_target
from carryover_hf.training import CarryoverTrainer, CarryoverTrainingArguments
from carryover_hf.training.synthetic import regenerate_random_prompts


PROMPT, RESPONSE, BLOCK = 8, 48, 8


def train(drafter, target, data, objective: str, steps: int, output_dir: str) -> None:
    args = CarryoverTrainingArguments(
        output_dir=output_dir, objective=objective, max_steps=steps, per_device_train_batch_size=8, num_anchors=16,
        learning_rate=3e-3, warmup_steps=0, logging_steps=steps, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    CarryoverTrainer(model=drafter, target_model=target, args=args, train_dataset=data, objective=objective).train()


def generate_and_time(target, prompt, drafter=None):
    start = time.perf_counter()
    # carryover_timing: the drafter's statistics record drafting / verification times (off by default).
    config = GenerationConfig(max_new_tokens=RESPONSE, do_sample=False, carryover_timing=True)
    output = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter, generation_config=config)
    return output, time.perf_counter() - start


def main() -> None:
    torch.manual_seed(0)
    # Models this small run fastest on one thread (and a second thread contending for a busy core is very slow).
    torch.set_num_threads(1)
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    config = CarryoverDrafterConfig.from_target_config(target.config, num_hidden_layers=1, block_size=BLOCK)
    drafter = CarryoverDrafterModel(config)
    print(f"target: {sum(p.numel() for p in target.parameters()):,} parameters; drafter: "
          f"{sum(p.numel() for p in drafter.parameters()):,} parameters, reads target layers {config.target_layer_ids}")

    data = regenerate_random_prompts(target, num_rows=64, prompt_length=PROMPT, response_length=RESPONSE, seed=0)
    prompt = torch.tensor([data[0]["input_ids"][:PROMPT]])  # a training prompt: the drafter has seen its answer
    with tempfile.TemporaryDirectory() as output_dir:
        for label, objective, steps in (("untrained", None, 0), ("dflash objective", "dflash", 150),
                                        ("+ carryover objective", "carryover", 50)):  # fmt: skip
            if steps:
                start = time.perf_counter()
                train(drafter.train(), target, data, objective, steps, output_dir)
                print(f"\ntrained {steps} steps with the {objective} objective in {time.perf_counter() - start:.0f} s")
            drafter.eval()
            reference, target_time = generate_and_time(target, prompt)
            output, drafter_time = generate_and_time(target, prompt, drafter)
            stats = drafter.last_generation_stats
            print(f"[{label}] identical to the target's greedy output: {torch.equal(output, reference)}")
            print(f"  rounds {stats.num_rounds}, mean acceptance length {stats.mean_acceptance_length:.2f}, "
                  f"acceptance lengths {stats.acceptance_lengths}")
            print(f"  carry rows per proposal {stats.carry_rows}")
            print(f"  drafting {stats.drafting_time * 1e3:.0f} ms + verification {stats.verification_time * 1e3:.0f} ms;"
                  f" wall {drafter_time * 1e3:.0f} ms vs target alone {target_time * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
