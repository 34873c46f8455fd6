# Convert an OpenMMLab 2.0 annotation file ({"metainfo", "data_list"}) to
# JSON Lines for RankShardedDataset, streaming (memory stays bounded by the
# largest single record, whatever the file size).
import argparse

from mmdata_plugin.datasets.jsonl_conversion import \
    convert_openmmlab_json_to_jsonl


def parse_args():
    parser = argparse.ArgumentParser(
        description='OpenMMLab 2.0 JSON annotations -> JSON Lines')
    parser.add_argument('src', help='the .json annotation file')
    parser.add_argument('dst', help='the .jsonl file to write')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bar')
    return parser.parse_args()


def main():
    args = parse_args()
    result = convert_openmmlab_json_to_jsonl(
        args.src, args.dst, progress=not args.no_progress)
    metainfo = ' + a metainfo line' if result['metainfo'] else ''
    print(f'{args.dst}: {result["num_samples"]} samples{metainfo}')


if __name__ == '__main__':
    main()
