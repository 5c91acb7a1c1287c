"""`python -m services.tinker -c tinker.json`"""

from __future__ import annotations

import argparse
import logging

from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.tinker.app import build_app
from services.tinker.config import TinkerConfig
from services.tinker.tinker import Tinker


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.tinker")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tinker %(levelname)s %(name)s %(message)s")
    config = load_config(args.config, TinkerConfig)
    serve(build_app(Tinker(config)), config.bind_addr)


if __name__ == "__main__":
    main()
