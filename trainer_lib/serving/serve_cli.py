"""``posttrain serve``: run Triton on a model repository in the foreground (Ctrl-C stops it).

    posttrain serve --repo DIR|s3://bucket/prefix [--http-port P] [--grpc-port Q] [--load NAME ...]
    posttrain serve --repo DIR --ask "Write add(a, b)" [--chat --compare HF_MODEL_DIR]

Prints one JSON line with the endpoints and the models' states, then serves until interrupted;
with ``--ask`` it sends one generate request instead, prints the served answer (and PyTorch's
greedy answer from ``--compare`` next to it), and stops the server.
Models are loaded with explicit model control, so ``posttrain deploy triton.url=<http endpoint>``
can publish and load new versions while it runs.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from trainer_lib.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain serve",
        description="Serve a Triton model repository with a local tritonserver (nvidia-pytriton, Python backend).",
    )
    parser.add_argument("--repo", help="model repository: local dir or s3://bucket/prefix (required without --url)")
    parser.add_argument(
        "--url", help="with --ask: ask the Triton server already running at this HTTP URL (a container's) instead"
    )
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (0: a free one) [default: 8000]")
    parser.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (0: a free one) [default: 8001]")
    parser.add_argument("--metrics-port", type=int, default=8002, help="metrics port (0: a free one) [default: 8002]")
    parser.add_argument("--address", default="127.0.0.1", help="address to listen on [default: 127.0.0.1]")
    parser.add_argument(
        "--load",
        action="append",
        metavar="NAME",
        help="model to load at start, repeatable [default: every model in the repository]",
    )
    parser.add_argument("--no-load", action="store_true", help="load nothing at start (deploy loads later)")
    parser.add_argument(
        "--env",
        default=None,
        help="the Triton environment (venv with nvidia-pytriton) [default: $POSTTRAIN_TRITON_ENV or .venv-triton]",
    )
    parser.add_argument(
        "--s3-endpoint", default=None, help="S3 endpoint for an s3:// repository [default: $AWS_ENDPOINT_URL]"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait until ready [default: 120]")
    parser.add_argument("--log", default="-", help="file for the server's log ('-': stderr) [default: -]")
    parser.add_argument("--ask", metavar="TEXT", help="send one generate request, print the answer, stop")
    parser.add_argument("--max-tokens", type=int, default=48, help="with --ask: max_tokens [default: 48]")
    parser.add_argument(
        "--compare",
        metavar="HF_MODEL_DIR",
        help="with --ask: also print PyTorch's greedy answer from this Hugging Face model",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="with --ask and --compare: wrap TEXT in that model's chat template first (the "
        "served model takes raw text, like Triton's LLM backends)",
    )
    return parser


def ask(server, args) -> dict:
    """One greedy generate request to the served model (the only one loaded, or --load's first), with
    PyTorch's greedy answer for the same text when ``--compare`` names the model it came from."""
    from trainer_lib.serving.client import connected, generate

    loaded = [m["name"] for m in server.model_states() if m.get("state") == "READY"]
    name = (args.load or loaded or [""])[0]
    if not name:
        raise UserError(f"--ask: no model is loaded from {args.repo or args.url}")
    text = args.ask
    if args.chat:
        if not args.compare:
            raise UserError("--chat: needs --compare (the chat template comes from that model's tokenizer)")
        from transformers import AutoTokenizer

        text = AutoTokenizer.from_pretrained(args.compare).apply_chat_template(
            [{"role": "user", "content": args.ask}], add_generation_prompt=True, tokenize=False
        )
    with connected(server.url) as client:
        answer = {"model": name, "prompt": text, **generate(client, name, text, max_tokens=args.max_tokens)}
    if args.compare:
        answer["pytorch"] = pytorch_greedy(args.compare, text, args.max_tokens)
    return answer


def pytorch_greedy(model_dir: str, text: str, max_new_tokens: int) -> str:
    """Greedy completion of raw ``text`` with the Hugging Face model, without the prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = tokenizer(text, return_tensors="pt")  # special tokens as the served tokenizer adds them
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def _check_repository(repo: str, endpoint: str | None) -> None:
    from trainer_lib import storage

    if endpoint:
        storage.configure(endpoint_url=endpoint)
    if not storage.isdir(repo) or not storage.listdir(repo):
        raise UserError(
            f"--repo: {repo} is empty or missing; publish a model into it first "
            f"(posttrain deploy export.path=... repository={repo})"
        )


def ask_running(args) -> int:
    """--url with --ask: wait until that server is ready, ask it, print the answer as a started server's."""
    from trainer_lib.serving.server import RunningServer, TritonServerError

    if args.ask is None:
        raise UserError("--url: only with --ask (the server is already running)")
    server = RunningServer(args.url.rstrip("/"))
    try:
        server.wait_ready(args.timeout)
    except TritonServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return print_answer(ask(server, args), args)


def print_answer(answer: dict, args) -> int:
    print(json.dumps(answer))
    print(f"served ({answer['model']} v{answer['model_version']}): {answer['text_output']!r}", file=sys.stderr)
    if "pytorch" in answer:
        print(f"PyTorch ({args.compare}): {answer['pytorch']!r}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from trainer_lib.serving.server import TritonServer, TritonServerError

    def stop_on_sigterm(signum, frame):  # a pod's SIGTERM stops the server like Ctrl-C
        raise KeyboardInterrupt

    if args.url:
        return ask_running(args)
    if not args.repo:
        raise UserError("--repo: required (or --url with --ask)")
    try:
        _check_repository(args.repo, args.s3_endpoint)
        server = TritonServer(
            args.repo,
            load=[] if args.no_load else (args.load or ["*"]),
            http_port=args.http_port or None,
            grpc_port=args.grpc_port or None,
            metrics_port=args.metrics_port or None,
            address=args.address,
            env=args.env,
            s3_endpoint_url=args.s3_endpoint,
            log_path=args.log,
        )
        server.start(timeout_s=args.timeout)
    except TritonServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.ask is not None:
        try:
            answer = ask(server, args)
        finally:
            server.stop()
        return print_answer(answer, args)
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    # Ctrl-C / SIGINT stops it even when it was started as a background job, which a shell starts
    # with SIGINT ignored (Python then leaves it ignored), or by a parent that had SIGINT blocked
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        models = [m for m in server.model_states() if m.get("state")]
        print(
            json.dumps({"http": server.url, "grpc": server.grpc_url, "repository": args.repo, "models": models}),
            flush=True,
        )
        print(
            f"serving {args.repo} on {server.url} (gRPC {server.grpc_url}); generate with POST "
            f"{server.url}/v2/models/<name>/generate; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        code = server.wait()
        print(f"error: tritonserver exited with code {code}:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0 if server.stop() in (0, None) else 1
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


if __name__ == "__main__":
    sys.exit(main())
