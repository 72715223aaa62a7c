"""The training programs of the tiny zoo and the SmolLM2 twins, run from a checkout (not shipped in the wheel):

python -m experiments.zoo train NAME [--steps N]      retrain a zoo model from its seed (resumes from
                                                      data/checkpoints/NAME), evaluate it, write its card
python -m experiments.zoo adapt NAME [--threads N]    adapt SmolLM2 (smollm2-135m-diffusion / -autoregressive): train
                                                      a LoRA adapter (resumes from data/checkpoints/NAME), ship it,
                                                      write its card
python -m experiments.zoo data                        write the held-out test sets: data/arithmetic_test.jsonl (new
                                                      text) and data/arithmetic_unseen_work_test.jsonl (new arithmetic)
python -m experiments.zoo over-training [NAME ...]    retrain with checkpoints (data/checkpoints/) and measure each into
                                                      data/over_training/training_dynamics.parquet; both resume"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from sinklib.paths import DATA_DIR, ZOO_DIR
from sinklib.validation import BadValue
from sinklib.zoo.recipes import VARIANTS, ZOO
from experiments.zoo import adapt, retrain
from experiments.zoo.data import held_out, write_jsonl
from experiments.zoo.evaluate import write_card
from experiments.zoo.train import save, train


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: it must be an integer >= 1")
    return value


def at_least_two(text: str) -> int:
    """argparse type: an integer >= 2 (a first and a last checkpoint at least)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: it must be an integer >= 2")
    return value


def _adapt(name: str, threads: int, eval_n: int) -> None:
    """Train (or resume) a SmolLM2 twin, ship its adapter, measure and write its card, print the headline."""
    adapt.train(name, threads=threads)
    adapt.export_adapter(name)
    # the new-arithmetic split at 200 (its 95 % interval within ±0.07): a diffusion twin pays 28 forwards an answer
    card = adapt.write_card(name, eval_n={"text": eval_n, "work": min(eval_n, 200)})
    print(json.dumps({k: card[k] for k in ("name", "accuracy", "final_loss", "wall_seconds")}, indent=1))


def main(argv: list[str] | None = None) -> None:
    """The command line above: `train` retrains, saves and evaluates a zoo model and prints its card's headline
    numbers; `data` writes the held-out test set; `over-training` retrains with checkpoints and measures them. A
    value the programs refuse before any work (sinklib's BadValue: a step count past the recipe's, say) ends as a
    usage error naming it, like argparse's own, not a traceback."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _run(args)
    except BadValue as error:
        parser.error(" ".join(str(error).split()))


def _run(args: argparse.Namespace) -> None:
    """One sub-command, as parsed."""
    if args.command == "adapt":
        _adapt(args.name, args.threads, args.eval_n)
        return
    if args.command == "data":
        write_jsonl(held_out(), DATA_DIR / "arithmetic_test.jsonl")
        write_jsonl(adapt.work_split(), DATA_DIR / "arithmetic_unseen_work_test.jsonl", prefix="work")
        return
    if args.command == "over-training":
        names = list(dict.fromkeys(args.names or ZOO))  # each once
        for name in names:
            retrain.retrain(name, count=args.checkpoint_count, threads=args.threads)
        print(retrain.measure_all(names, count=args.checkpoint_count).to_string())
        return
    total = args.steps or ZOO[args.name].steps  # saved every --checkpoint-every steps: a stopped run resumes there
    model, curve = train(args.name, args.out, steps=args.steps, threads=args.threads,
                         curve_path=args.out / f"{args.name}.loss.csv", checkpoints=DATA_DIR / "checkpoints" / args.name,
                         checkpoint_at=tuple(range(args.checkpoint_every, total + 1, args.checkpoint_every)))
    folder = save(args.name, model, args.out, curve, {"threads": args.threads})
    (args.out / f"{args.name}.loss.csv").replace(folder / "loss_curve.csv")
    card = write_card(args.name, folder, eval_n=args.eval_n)
    print(json.dumps({k: card[k] for k in ("name", "accuracy", "final_loss", "wall_seconds")}, indent=1))


def _parser() -> argparse.ArgumentParser:
    """The command line's parser: one sub-command per line of the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m experiments.zoo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train_cmd = sub.add_parser("train", help="train a zoo model")
    train_cmd.add_argument("name", choices=sorted(ZOO))
    train_cmd.add_argument("--steps", type=positive_int, default=None)
    train_cmd.add_argument("--out", type=Path, default=ZOO_DIR)
    train_cmd.add_argument("--eval-n", type=positive_int, default=600)
    train_cmd.add_argument("--threads", type=positive_int, default=2,
                           help="torch threads (the run's bits depend on it; the card records it)")
    train_cmd.add_argument("--checkpoint-every", type=positive_int, default=500,
                           help="steps between the checkpoints a stopped run resumes from (data/checkpoints/NAME)")
    adapt_cmd = sub.add_parser("adapt", help="adapt SmolLM2 into a twin (resumable), ship its adapter and card")
    adapt_cmd.add_argument("name", choices=sorted(adapt.TWINS))
    adapt_cmd.add_argument("--threads", type=positive_int, default=1)
    adapt_cmd.add_argument("--eval-n", type=positive_int, default=500)
    sub.add_parser("data", help="write the held-out JSONL")
    dynamics_cmd = sub.add_parser("over-training", help="retrain with checkpoints and measure every checkpoint")
    dynamics_cmd.add_argument("names", nargs="*", choices=[*ZOO, *VARIANTS], metavar="NAME",
                              help=f"zoo models or variants (default: the zoo); one of {[*ZOO, *VARIANTS]}")
    dynamics_cmd.add_argument("--checkpoint-count", type=at_least_two, default=8,
                              help="log-spaced checkpoints after the initialisation (>= 2)")
    dynamics_cmd.add_argument("--threads", type=positive_int, default=2)
    return parser


if __name__ == "__main__":
    main()
