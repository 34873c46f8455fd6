# Build (or check) the line index of an annotation file ahead of training,
# e.g. once on a login node; RankShardedDataset then only opens it.
import argparse

from mmdata_plugin.datasets.line_index import (annotation_format,
                                               build_line_index,
                                               default_index_path,
                                               index_build_lock, index_problem)


def parse_args():
    parser = argparse.ArgumentParser(
        description='Index the sample lines of an annotation file for '
        'RankShardedDataset')
    parser.add_argument('ann_file', help='annotation file (lines or JSONL)')
    parser.add_argument(
        '--format',
        default='auto',
        choices=['auto', 'lines', 'jsonl'],
        help='annotation format (auto: by extension)')
    parser.add_argument(
        '--index-file', help='where to write the index (default: as the '
        'dataset would look for it)')
    parser.add_argument(
        '--index-dir', help='folder for the index (the dataset\'s index_dir)')
    parser.add_argument(
        '--force', action='store_true', help='rebuild even if up to date')
    parser.add_argument(
        '--check', action='store_true',
        help='only report whether the index is up to date (exit code 1 if '
        'not)')
    return parser.parse_args()


def main():
    args = parse_args()
    fmt = annotation_format(args.ann_file, args.format)
    index_file = args.index_file or default_index_path(
        args.ann_file, args.index_dir, fmt)
    with index_build_lock(index_file):
        problem = index_problem(index_file, args.ann_file, fmt)
        if args.check:
            print(f'{index_file}: {problem or "up to date"}')
            raise SystemExit(1 if problem else 0)
        if problem is None and not args.force:
            print(f'{index_file} is up to date')
            return
        header = build_line_index(args.ann_file, index_file, fmt)
    size_mb = header['fingerprint']['size'] / 1e6
    print(f'{index_file}: {header["num_samples"]} samples in '
          f'{header["num_lines"]} lines, {size_mb:.1f} MB indexed in '
          f'{header["seconds"]:.2f} s ({size_mb / header["seconds"]:.0f} '
          'MB/s)')


if __name__ == '__main__':
    main()
