# Write the demo image-classification set (real JPEGs of mixed sizes).
import argparse
import os.path as osp
import time

from mmdata_plugin.datasets.litdata_chunk_writer import \
    pack_image_list_litdata
from mmdata_plugin.datasets.mds_shard_writer import pack_image_list_mds
from mmdata_plugin.datasets.tar_shard_writer import pack_image_list
from mmdata_plugin.utils import make_demo_dataset


def parse_args():
    parser = argparse.ArgumentParser(
        description='Write the demo set: JPEGs of mixed sizes (small images '
        'and 720p/1080p frames) and `relative/path label` annotation files')
    parser.add_argument(
        '--out', default='data/demo', help='output folder (data/demo)')
    parser.add_argument('--num-train', type=int, default=512)
    parser.add_argument('--num-val', type=int, default=128)
    parser.add_argument(
        '--max-side',
        type=int,
        default=1920,
        help='cap on the longer image side, in pixels')
    parser.add_argument('--quality', type=int, default=90, help='JPEG quality')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--tar-shards',
        type=int,
        default=0,
        metavar='N',
        help='also pack each split into WebDataset tar shards of N samples '
        'under OUT/tar (configs/demo/tinycnn_demo-jpeg-tar.py reads them)')
    parser.add_argument(
        '--mds-shards',
        type=int,
        default=0,
        metavar='N',
        help='also pack each split into MosaicML Streaming MDS shards of N '
        'samples under OUT/mds/<split> (configs/demo/tinycnn_demo-jpeg-mds.py '
        'reads them)')
    parser.add_argument(
        '--litdata-chunks',
        type=int,
        default=0,
        metavar='N',
        help='also pack each split into LitData chunks of N samples under '
        'OUT/litdata/<split> (configs/demo/tinycnn_demo-jpeg-litdata.py reads '
        'them)')
    return parser.parse_args()


def main():
    args = parse_args()
    start = time.perf_counter()
    ann_files = make_demo_dataset(
        args.out,
        num_train=args.num_train,
        num_val=args.num_val,
        max_side=args.max_side,
        quality=args.quality,
        seed=args.seed)
    print(f'Wrote {args.num_train} train and {args.num_val} val images to '
          f'{args.out} in {time.perf_counter() - start:.1f} s; annotations: '
          + ', '.join(ann_files.values()))
    if args.tar_shards:
        for split, ann_file in ann_files.items():
            shards = pack_image_list(ann_file, args.out,
                                     osp.join(args.out, 'tar'), split,
                                     args.tar_shards)
            print(f'Packed {split} into {len(shards)} tar shards: '
                  f'{shards[0]} ...')
    if args.mds_shards:
        for split, ann_file in ann_files.items():
            shards = pack_image_list_mds(ann_file, args.out,
                                         osp.join(args.out, 'mds', split),
                                         args.mds_shards)
            print(f'Packed {split} into {len(shards)} MDS shards: '
                  f'{shards[0]} ...')
    if args.litdata_chunks:
        for split, ann_file in ann_files.items():
            chunks = pack_image_list_litdata(
                ann_file, args.out, osp.join(args.out, 'litdata', split),
                args.litdata_chunks)
            print(f'Packed {split} into {len(chunks)} LitData chunks: '
                  f'{chunks[0]} ...')


if __name__ == '__main__':
    main()
