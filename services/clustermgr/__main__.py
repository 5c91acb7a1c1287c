"""`python -m services.clustermgr -c clustermgr.json`"""

from __future__ import annotations

import argparse
import logging

from libs.rpc.config import load_config
from libs.rpc.server import serve
from services.clustermgr.app import build_app
from services.clustermgr.config import ClusterMgrConfig
from services.clustermgr.manager import ClusterManager


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.clustermgr")
    parser.add_argument("-c", "--config", required=True, help="path of the JSON config file")
    args = parser.parse_args()
    config = load_config(args.config, ClusterMgrConfig)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s clustermgr{config.node_id} %(levelname)s %(name)s %(message)s")
    manager = ClusterManager(config)
    serve(build_app(manager), config.me.http_addr)


if __name__ == "__main__":
    main()
