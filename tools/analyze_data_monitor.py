# Re-render a DataMonitorHook report (data_monitor.json): tables and plot.
import argparse
import os.path as osp
import sys

from mmdata_plugin.data_monitor import format_report, load_report, plot_report


def parse_args():
    parser = argparse.ArgumentParser(
        description='Print the tables, verdict and advice of a data-monitor '
        'report (data_monitor.json, written by DataMonitorHook or '
        'DataLoaderMonitor) and draw its plot')
    parser.add_argument('report', help='path of data_monitor.json')
    parser.add_argument(
        '--out', help='PNG to write (default: the report path with .png)')
    parser.add_argument(
        '--no-plot', action='store_true', help='print the tables only')
    parser.add_argument(
        '--rank',
        type=int,
        help='show this rank (default: the rank the verdict was made on)')
    return parser.parse_args()


def main():
    args = parse_args()
    try:
        report = load_report(args.report)
        print(format_report(report, args.rank))
        if not args.no_plot:
            out = args.out or osp.splitext(args.report)[0] + '.png'
            print(f'\nPlot written to {plot_report(report, out, args.rank)}')
    except (OSError, ValueError) as error:
        sys.exit(f'error: {error}')


if __name__ == '__main__':
    main()
