"""Serve a folder as a stand-in remote: ``python -m
mmdata_plugin.testing.serve_loopback FOLDER --latency 0.05``.

Binds 127.0.0.1 only and stops after ``--lifetime`` seconds or on Ctrl-C.
"""
import time
from typing import Optional, Sequence

from .loopback_http import LoopbackHTTPServer


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Serve a folder on 127.0.0.1 until Ctrl-C or ``--lifetime`` ends."""
    import argparse
    parser = argparse.ArgumentParser(
        description='Serve a folder over HTTP on 127.0.0.1 with injected '
        'latency, a bandwidth cap and faults (a stand-in remote store).')
    parser.add_argument('root', help='folder to serve')
    parser.add_argument('--port', type=int, default=0)
    parser.add_argument('--latency', type=float, default=0.0,
                        help='seconds per request')
    parser.add_argument('--bandwidth', type=float, default=None,
                        help='bytes/s shared by all connections')
    parser.add_argument('--fault-rate', type=float, default=0.0)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--lifetime', type=float, default=3600.0,
                        help='stop after this many seconds')
    args = parser.parse_args(argv)
    server = LoopbackHTTPServer(
        args.root,
        latency=args.latency,
        bandwidth=args.bandwidth,
        fault_rate=args.fault_rate,
        seed=args.seed,
        max_lifetime=args.lifetime,
        port=args.port)
    with server:
        print(server.base_url, flush=True)
        try:
            while server.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == '__main__':
    main()
