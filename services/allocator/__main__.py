"""`python -m services.allocator -c allocator.json`"""

from __future__ import annotations

import argparse
import logging

from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.allocator.allocator import Allocator
from services.allocator.app import build_app
from services.allocator.config import AllocatorConfig


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.allocator")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s allocator %(levelname)s %(name)s %(message)s")
    config = load_config(args.config, AllocatorConfig)
    serve(build_app(Allocator(config)), config.bind_addr)


if __name__ == "__main__":
    main()
