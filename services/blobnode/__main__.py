"""`python -m services.blobnode -c blobnode.json`"""

from __future__ import annotations

import argparse
import logging

from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.blobnode.app import build_app
from services.blobnode.config import BlobnodeConfig
from services.blobnode.node import Blobnode


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.blobnode")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s blobnode %(levelname)s %(message)s")
    node = Blobnode(load_config(args.config, BlobnodeConfig))
    try:
        serve(build_app(node), node.config.bind_addr)
    finally:
        node.close()


if __name__ == "__main__":
    main()
