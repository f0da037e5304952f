"""``posttrain dashboard``: watch and compare runs in a browser (docs/dashboard.md).

    posttrain dashboard [--runs DIR|URL ...] [--kfp-host URL] [--http-port P] [--host ADDR] [--token-file FILE]

Read-only. It binds 127.0.0.1 unless ``--host`` says otherwise; any other address needs an access
token, from ``$POSTTRAIN_DASHBOARD_TOKEN`` or ``--token-file`` (never the command line, which other
users of the machine can read).
"""

from __future__ import annotations

import argparse
import sys

TOKEN_ENV = "POSTTRAIN_DASHBOARD_TOKEN"


def read_token(token_file: str | None) -> str | None:
    from trainer_lib.values import read_secret

    return read_secret("--token-file", token_file or "", TOKEN_ENV) or None


def main(argv: list[str]) -> int:
    from trainer_lib.dashboard.web import Dashboard, serve

    parser = argparse.ArgumentParser(prog="posttrain dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        action="append",
        default=[],
        help="a runs folder, pipeline root, stage output or storage URL (s3://...); repeatable [default: runs]",
    )
    parser.add_argument("--kfp-host", help="also show the runs of this Kubeflow Pipelines API (bearer: $KFP_TOKEN)")
    parser.add_argument("--kfp-namespace", help="the KFP namespace (multi-user installs)")
    parser.add_argument(
        "--kfp-pipeline-root",
        default=None,
        help="where runs that set no pipeline root keep their outputs [default: KFP's minio://mlpipeline/v2/artifacts]",
    )
    parser.add_argument("--http-port", type=int, default=8265, help="HTTP port (0: a free one) [default: 8265]")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind; beyond loopback a token is required")
    parser.add_argument("--token-file", help=f"file holding the access token [default: ${TOKEN_ENV}]")
    args = parser.parse_args(argv)
    from trainer_lib.dashboard.kfp_runs import DEFAULT_PIPELINE_ROOT

    roots = args.runs or ([] if args.kfp_host else ["runs"])
    token = read_token(args.token_file)
    kfp = None
    if args.kfp_host:
        kfp = {
            "host": args.kfp_host,
            "namespace": args.kfp_namespace,
            "pipeline_root": args.kfp_pipeline_root or DEFAULT_PIPELINE_ROOT,
        }
    server = serve(Dashboard(roots, token=token, kfp=kfp), args.host, args.http_port)
    host, port = server.server_address[:2]
    shown = [*roots, *([f"KFP at {args.kfp_host}"] if args.kfp_host else [])]
    print(f"dashboard: http://{host}:{port}/ ({', '.join(shown)}); Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
