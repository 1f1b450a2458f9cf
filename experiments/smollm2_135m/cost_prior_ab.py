"""A/B of the measured round cost's prior in one benchmark run (2026-12-07): the same drafter loaded twice, `old`
with `MeasuredCost` as the package has it (pseudo-rounds at the prior's costs in the first timed round's seconds,
fading as 1 / (1 + rounds) to nothing) and `new` with the candidate kept here (the prior scaled by all the timed
rounds and never below 8 % of their weight), against the target alone, prompts interleaved, one thread.

    python experiments/smollm2_135m/cost_prior_ab.py --drafter drafters/carryover-hf/smollm2-135m-campaign-markov \
        --num_prompts 10 --output_dir ../runs/cost-prior-ab

The rest of the method is the bench's `policy_alone` (cost policy, drafter only, carry off, measured costs at T = 0).
The candidate lost (0.975x [0.951, 1.003], benchmarks/results/smollm2-135m-cost-prior-ab/) and did not land.

With `--explore_every N`, `new` is instead the package's estimator with the policy offering one draft more or fewer
than chosen every N-th drafter round (`_exploring`). With N = 8 it tied: 1.008x [0.965, 1.049]; not landed."""
import argparse

import carryover_hf  # noqa: F401
from carryover_hf import generation
from carryover_hf.round_policy import ROUND_POLICY_STATE_ATTRIBUTE, MeasuredCost, _accumulate, _solve
from carryover_hf.tools.bench.cli import main as bench_main

PRIOR_SHARE = 0.08


class KeptPriorMeasuredCost(MeasuredCost):
    """The candidate: the prior's pseudo-rounds at the scale of all the timed rounds (decayed sums of seconds over
    prior costs), weighing prior_rounds / (1 + timed rounds) but never less than PRIOR_SHARE of the rounds' weight."""

    def record(self, source, drafts, seconds):
        if not seconds > 0:
            return
        if not hasattr(self, "base_gram"):  # the pseudo-rounds in the prior's own units, once
            self.base_gram, self.base_moment = [[0.0] * 4 for _ in range(4)], [0.0] * 4
            for anchor in self.anchors:
                _accumulate(self.base_gram, self.base_moment, self._features(*anchor), self.prior(*anchor),
                            1.0 / len(self.anchors))  # fmt: skip
            self.seconds, self.modelled = 0.0, 0.0
        elif self.weight >= 5:
            seconds = min(seconds, self.outlier * self(source, drafts))
        self.gram = [[value * self.decay for value in row] for row in self.gram]
        self.moment = [value * self.decay for value in self.moment]
        self.seconds = self.seconds * self.decay + seconds
        self.modelled = self.modelled * self.decay + self.prior(source, drafts)
        self.weight = self.weight * self.decay + 1.0
        self.rounds += 1
        self.timed[source] = self.timed.get(source, 0) + 1
        _accumulate(self.gram, self.moment, self._features(source, drafts), seconds, 1.0)
        strength = max(self.prior_rounds / (1 + self.rounds), PRIOR_SHARE * self.weight)
        unit = self.seconds / self.modelled
        gram = [[a + strength * b for a, b in zip(row, prior)] for row, prior in zip(self.gram, self.base_gram)]
        self.coefficients = _solve(gram, [a + strength * unit * b for a, b in zip(self.moment, self.base_moment)])


def _exploring(policy, every: int):
    """This policy's every `every`-th drafter round (probes aside) offers one draft more or one fewer than it chose,
    in turn, never under 1 or over what the round allows: a fixed schedule, so it reads no unverified token."""
    plan, rounds = policy.plan, [0]

    def explore(input_ids, first_draft_accepted, accepted_drafts=None):
        chosen = plan(input_ids, first_draft_accepted, accepted_drafts)
        if chosen.kind != "draft" or policy.probing:
            return chosen
        rounds[0] += 1
        if rounds[0] % every:
            return chosen
        room = min(policy.block_size - 1, policy.max_length - input_ids.shape[1] - 1)
        drafts = min(max(chosen.num_drafts + (1 if (rounds[0] // every) % 2 else -1), 1), room)
        policy.last = ("draft", drafts)
        return type(chosen)("draft", num_drafts=drafts)

    policy.plan = explore


def _with_candidate_cost(original, explore_every: int = 0):
    """`new`'s calls get the kept prior, or with `explore_every` the package's estimator with exploration."""

    def cost_aware_policy(target, drafter, input_ids, generation_config):
        policy = original(target, drafter, input_ids, generation_config)
        cost = policy.cost
        if getattr(drafter, "_ab_arm", None) == "new" and explore_every:
            _exploring(policy, explore_every)
        elif getattr(drafter, "_ab_arm", None) == "new" and type(cost) is MeasuredCost and cost.rounds == 0:
            candidate = KeptPriorMeasuredCost(cost.prior, cost.anchors, prior_rounds=cost.prior_rounds)
            policy.cost = candidate
            learnt = drafter.__dict__[ROUND_POLICY_STATE_ATTRIBUTE]
            for key, value in learnt.items():
                if value is cost:
                    learnt[key] = candidate
            print(f"cost_prior_ab: the new arm's drafter {id(drafter)} uses {type(candidate).__name__}", flush=True)
        return policy

    return cost_aware_policy


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--num_prompts", type=int, default=10)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--explore_every", type=int, default=0,
                        help="new = the package's estimator with exploration every N drafter rounds, not the kept prior")
    args = parser.parse_args()
    generation.cost_aware_policy = _with_candidate_cost(generation.cost_aware_policy, args.explore_every)
    from carryover_hf.tools.bench import cli

    load = cli._load_drafter

    def tagged(path, target, dtype, block_size, index):  # the first drafter (new=...) carries the candidate
        drafter = load(path, target, dtype, block_size, index)
        drafter._ab_arm = "old" if index == 1 else "new"
        return drafter

    cli._load_drafter = tagged
    bench_main(["--target", "smollm2-135m", "--dtype", "float32", "--drafter", f"new={args.drafter}",
                "--drafter", f"old={args.drafter}", "--methods", "target", "policy_alone",
                "--compare", "new/policy_alone,old/policy_alone", "--prompts", "assets/prompts", "--split", "eval",
                "--num_prompts", str(args.num_prompts), "--max_new_tokens", "128", "--temperatures", "0",
                "--threads", "1", "--warmup", "1", "--seed", "0", "--no_overhead", "--output_dir", args.output_dir])


if __name__ == "__main__":
    main()
