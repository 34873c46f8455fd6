# Write the samples of any registered dataset (mmdet's CocoDataset, mmseg's
# ADE20KDataset, mmpretrain's ImageNet, a custom BaseDataset ...) as the JSON
# Lines file of a RankShardedDataset, and print the config block that reads
# it through the original pipeline. --check K compares K random samples of
# the two datasets.
import argparse
import sys

from mmengine.registry import DATASETS

from mmdata_plugin.datasets.coco_annotations import (coco_files,
                                                     dropped_annotations,
                                                     format_dropped,
                                                     missing_key)
from mmdata_plugin.datasets.data_list_dump import (NotPlainRecordError,
                                                   config_path_text,
                                                   dump_data_list,
                                                   format_config_block,
                                                   rank_sharded_dataset_config,
                                                   source_dataset)
from mmdata_plugin.datasets.dump_check import check_dump, format_check
from mmdata_plugin.utils.tool_config import (add_dataloader_arguments,
                                             load_dataloader_config)


def parse_args():
    parser = argparse.ArgumentParser(
        description='Dump a config\'s dataset to JSON Lines for '
        'RankShardedDataset')
    parser.add_argument('config', help='the config whose dataset to dump')
    parser.add_argument('out', help='the .jsonl file to write')
    add_dataloader_arguments(parser)
    parser.add_argument(
        '--part',
        type=int,
        help='for a ConcatDataset: which of its datasets to dump')
    parser.add_argument(
        '--keep-paths',
        action='store_true',
        help='write path values as they are instead of relative to the '
        'dataset\'s data_prefix')
    parser.add_argument(
        '--check',
        type=int,
        default=0,
        metavar='K',
        help='then compare K random samples of the written file, read '
        'through RankShardedDataset and the original pipeline, with the '
        'original dataset')
    parser.add_argument(
        '--seed', type=int, default=0, help='seed of --check (0)')
    parser.add_argument(
        '--no-progress', action='store_true', help='no progress bar')
    return parser.parse_args()


def dataset_config_at(dataloader_cfg, path):
    config = dataloader_cfg.dataset
    for key in path:
        config = config[key]
    return config


def build_dataset(args, dataset_cfg):
    """The dataset; a COCO file's record without a key the dataset reads
    is named (pycocotools' bare KeyError names nothing)."""
    try:
        return DATASETS.build(dataset_cfg)
    except KeyError:
        problem = next(filter(None, map(missing_key, coco_files(dataset_cfg))),
                       None)
        if problem is None:
            raise
        sys.exit(f'{args.config}: {args.split}_dataloader.dataset cannot be '
                 f'built: {problem}')


def main():
    args = parse_args()
    cfg, dataloader_cfg = load_dataloader_config(args.config, args.split,
                                                 args.cfg_options)
    wrapper = build_dataset(args, dataloader_cfg.dataset)
    try:
        dataset, path = source_dataset(wrapper, args.part)
        dataset_cfg = dataset_config_at(dataloader_cfg, path)
        result = dump_data_list(dataset, args.out, args.keep_paths,
                                not args.no_progress)
    except NotPlainRecordError as error:
        sys.exit(f'{args.config}: {args.split}_dataloader.dataset '
                 f'({type(wrapper).__name__}) cannot be dumped: {error}')
    config = rank_sharded_dataset_config(dataset, dataset_cfg, args.out,
                                         result)
    print(f'{args.out}: {result.num_samples} samples of '
          f'{type(dataset).__name__} (after its filter_cfg) + a metainfo '
          f'line ({", ".join(sorted(result.metainfo)) or "empty"})')
    if any(isinstance(key, int) for key in path):
        # Inside a list: the config of that item, to put there by hand.
        print(f'# the RankShardedDataset for {args.split}_dataloader.dataset'
              f'{config_path_text(path)} (put it there):')
        path = ()
    else:
        print('# paste into the new config (which inherits this one):')
    print(format_config_block(cfg, args.split, config, path))
    if args.check:
        sharded = DATASETS.build({
            key: value
            for key, value in config.items() if key != '_delete_'
        } | dict(index_progress=False))
        checks = check_dump(dataset, sharded, args.check, args.seed)
        print(format_check(checks))
        for path in coco_files(dataset_cfg):
            report = dropped_annotations(path)
            if report is not None:
                print(format_dropped(report))
        if any(check.differences for check in checks):
            sys.exit(1)


if __name__ == '__main__':
    main()
