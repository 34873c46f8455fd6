# Does the GPU get its batches? The batch hand-over into the training
# process, alone and feeding a model, against the model's own speed.
import argparse
import itertools
import statistics
import time
from typing import Callable, Dict, List

import cv2
import numpy as np
import torch
from mmengine.dataset import default_collate, pseudo_collate
from mmengine.model import BaseModel, ImgDataPreprocessor
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.structures import BaseDataElement
from torch.utils.data import DataLoader, Dataset

import mmdata_plugin  # noqa: F401  (registers block_collate)
from mmdata_plugin.handover import (DeviceFeeder, block_collate,
                                   pass_device_batches, receive_packed)
from mmdata_plugin.models import TinyCNNClassifier

PREFETCH = 2
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def parse_args():
    parser = argparse.ArgumentParser(
        description='Hand-over alone (ready samples: a uint8 image and a '
        'data sample with a label, so only the hand-over costs) with '
        'pseudo_collate, default_collate and block_collate: samples/s and '
        "the training process's CPU per batch; with --feed, a model's step "
        'rate on a batch in memory against the same model fed by each '
        'loader. Rounds are interleaved; medians are printed.')
    parser.add_argument('--device', default='cuda' if
                        torch.cuda.is_available() else 'cpu')
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--size', type=int, default=224, help='image side')
    parser.add_argument('--batches', type=int, default=30,
                        help='batches measured per run, after 5 of warm-up')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--feed', action='store_true',
                        help='also train a model (see --model)')
    parser.add_argument('--model', default='tiny',
                        choices=('tiny', 'resnet50'),
                        help='resnet50 needs torchvision (bf16 autocast and '
                        'channels_last on CUDA)')
    parser.add_argument('--collates', default='pseudo,default,block')
    parser.add_argument(
        '--preprocess',
        type=int,
        default=None,
        help='1: also time the loader followed by the data preprocessor '
        '(default on CUDA; on a CPU its per-sample normalisation takes '
        'seconds per batch)')
    parser.add_argument(
        '--samples',
        default='cropped',
        choices=('cropped', 'ready', 'decoded'),
        help='cropped: a crop and flip of a cached image per sample (a warm '
        'decode-once pipeline); ready: ready-made samples, so that only the '
        'hand-over costs; decoded: a JPEG (--jpeg-size) decoded, cropped and '
        'flipped per sample (a pipeline that decodes every epoch: the '
        'hand-over alone is then what its workers produce)')
    parser.add_argument('--jpeg-size', default='1024x768',
                        help='WxH of the decoded samples\' JPEGs')
    return parser.parse_args()


class ReadySamples(Dataset):
    """Samples as a pipeline leaves them: a uint8 image (3, size, size) and
    a data sample with a label.

    Args:
        size (int): The image side.
        kind (str): ``'cropped'``: a crop and flip of a cached image (a warm
            decode-once pipeline); ``'ready'``: a ready-made copy of a packed
            image, so that only the hand-over costs; ``'decoded'``: a JPEG
            of ``jpeg_size`` decoded, then cropped and flipped.
        jpeg_size (tuple): (width, height) of the decoded kind's JPEGs.
        length (int): Samples in the dataset.
    """

    def __init__(self, size: int, kind: str = 'cropped',
                 jpeg_size: tuple = (1024, 768),
                 length: int = 100_000) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 255, (8, size + 32, size + 32, 3),
                                   dtype=np.uint8)
        self.packed = [
            torch.from_numpy(
                np.ascontiguousarray(
                    image[:size, :size].transpose(2, 0, 1)))
            for image in self.images
        ]
        self.jpegs = [self._jpeg(rng, jpeg_size) for _ in range(4)
                      ] if kind == 'decoded' else []
        self.size, self.kind, self.length = size, kind, length

    @staticmethod
    def _jpeg(rng, jpeg_size: tuple) -> np.ndarray:
        # Smooth content, so the JPEG is photo-sized (noise would be huge).
        width, height = jpeg_size
        small = rng.integers(0, 255, (height // 16, width // 16, 3),
                             dtype=np.uint8)
        image = cv2.resize(small, (width, height),
                           interpolation=cv2.INTER_CUBIC)
        return cv2.imencode('.jpg', image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1]

    def __len__(self) -> int:
        return self.length

    def _image(self, index: int) -> torch.Tensor:
        if self.kind == 'ready':
            # A tensor of its own per sample: one shared by several
            # samples would travel once.
            return self.packed[index % len(self.packed)].clone()
        if self.kind == 'decoded':
            image = cv2.imdecode(self.jpegs[index % len(self.jpegs)],
                                 cv2.IMREAD_COLOR)
        else:
            image = self.images[index % len(self.images)]
        y = index % (image.shape[0] - self.size)
        x = (index * 7) % (image.shape[1] - self.size)
        crop = image[y:y + self.size, x:x + self.size]
        if index % 2:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)))

    def __getitem__(self, index: int) -> dict:
        sample = BaseDataElement(metainfo=dict(
            img_path=f'{index}.jpg', img_shape=(self.size, self.size)))
        sample.gt_label = torch.tensor([index % 1000])
        return dict(inputs=self._image(index), data_samples=sample)


COLLATES: Dict[str, Callable] = dict(
    pseudo=pseudo_collate, default=default_collate, block=block_collate)


def loader_warmup(args) -> int:
    """Batches to take before timing a loader: those its workers made ahead
    while it started (the rate is then what they produce, not a drain of
    what they had ready)."""
    return max(5, PREFETCH * args.workers)


def make_loader(args, collate: str) -> DataLoader:
    return DataLoader(
        ReadySamples(args.size, args.samples,
                     tuple(map(int, args.jpeg_size.split('x')))),
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=True,
        prefetch_factor=PREFETCH,
        pin_memory=args.device.startswith('cuda'),
        collate_fn=COLLATES[collate])


def batches(loader: DataLoader, device: torch.device, collate: str):
    """The loader's batches as the data preprocessor gets them."""
    iterator = iter(loader)
    if collate == 'block':
        return DeviceFeeder(iterator, device)
    return iterator


def preprocessor(device) -> ImgDataPreprocessor:
    pre = ImgDataPreprocessor(
        mean=MEAN, std=STD, bgr_to_rgb=True, non_blocking=True).to(device)
    # What DeviceFeedHook does: a fed batch is on the device already.
    pre.cast_data = pass_device_batches(pre.cast_data)
    return pre


def sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_run(step: Callable, source, count: int, device,
             warmup: int = 5) -> tuple:
    """(batches/s, training-process CPU ms per batch) over ``count``, after
    ``warmup`` batches."""
    for _ in range(warmup):
        step(next(source))
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        step(next(source))
    sync(device)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, 1e3 * cpu / count


def handover_round(args, device, collate: str) -> dict:
    loader = make_loader(args, collate)
    pre = preprocessor(device)
    source = batches(loader, device, collate)
    results = {}
    results['handover'] = time_run(pre.cast_data, source, args.batches,
                                   device, loader_warmup(args))
    if args.preprocess:
        results['preprocess'] = time_run(lambda b: pre(b, True), source,
                                         args.batches, device)
    del source, loader  # the workers go before the next run starts
    return results


class TorchvisionResNet50(BaseModel):

    def __init__(self) -> None:
        import torchvision
        super().__init__(data_preprocessor=dict(
            type='ImgDataPreprocessor', mean=MEAN, std=STD, bgr_to_rgb=True,
            non_blocking=True))
        self.net = torchvision.models.resnet50()

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if inputs.is_cuda:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        logits = self.net(inputs)
        labels = torch.cat([s.gt_label for s in data_samples])
        return dict(loss=torch.nn.functional.cross_entropy(logits, labels))


def build_model(args, device):
    if args.model == 'resnet50':
        model = TorchvisionResNet50().to(device)
        if device.type == 'cuda':
            model = model.to(memory_format=torch.channels_last)
    else:
        model = TinyCNNClassifier(
            num_classes=1000,
            data_preprocessor=dict(
                type='ImgDataPreprocessor', mean=MEAN, std=STD,
                bgr_to_rgb=True, non_blocking=True)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if device.type == 'cuda':
        wrapper = AmpOptimWrapper(optimizer=optimizer, dtype='bfloat16')
    else:
        wrapper = OptimWrapper(optimizer=optimizer)
    return model, wrapper


def feed_rounds(args, device, collates: List[str]) -> Dict[str, list]:
    model, wrapper = build_model(args, device)
    pre = model.data_preprocessor
    pre.cast_data = pass_device_batches(pre.cast_data)
    in_memory = default_collate(
        [ReadySamples(args.size)[i] for i in range(args.batch_size)])
    if device.type == 'cuda':
        in_memory['inputs'] = in_memory['inputs'].pin_memory()

    def train(batch):
        model.train_step(batch, wrapper)

    def repeat():
        while True:
            yield in_memory

    # First steps pay for kernel selection and allocator growth.
    time_run(train, repeat(), 10, device)
    rates = dict(model_alone=[], **{c: [] for c in collates})
    loaders = {c: make_loader(args, c) for c in collates}
    if 'block' in collates:
        # The fed batches themselves, without the loader running beside
        # the step: what is left of a gap is then the batch, not the feed.
        placed = list(itertools.islice(
            batches(loaders['block'], device, 'block'), 8))
        rates['block_placed'] = []
    for _ in range(args.rounds):
        rates['model_alone'].append(
            time_run(train, repeat(), args.batches, device)[0])
        for collate in collates:
            source = batches(loaders[collate], device, collate)
            rates[collate].append(
                time_run(train, source, args.batches, device,
                         loader_warmup(args))[0])
        if 'block' in collates:
            rates['block_placed'].append(
                time_run(train, itertools.cycle(placed), args.batches,
                         device)[0])
    return rates


def main():
    args = parse_args()
    device = torch.device(args.device)
    receive_packed(True)  # as DeviceFeedHook does while it feeds
    if args.preprocess is None:
        args.preprocess = device.type == 'cuda'
    collates = args.collates.split(',')
    print(f'device {device}, batch {args.batch_size} of 3x{args.size}x'
          f'{args.size} uint8 + a labelled data sample ({args.samples}), '
          f'{args.workers} '
          f'workers, pin_memory={device.type == "cuda"}, {args.batches} '
          f'batches x {args.rounds} interleaved rounds (medians)')
    runs = {c: [] for c in collates}
    for _ in range(args.rounds):
        for collate in collates:
            runs[collate].append(handover_round(args, device, collate))
    print('\nHand-over alone: the loader until the batch is on the device as '
          'the data preprocessor wants it (then + the preprocessor)')
    print(f'{"collate":<16} {"samples/s":>10} {"CPU ms/batch":>13} '
          f'{"x pseudo":>9}' +
          (f' {"+preproc samples/s":>19} {"CPU ms":>7}'
           if args.preprocess else ''))
    size = args.batch_size
    base = statistics.median(r['handover'][0] for r in runs[collates[0]])
    for collate in collates:
        rate = statistics.median(r['handover'][0] for r in runs[collate])
        cpu = statistics.median(r['handover'][1] for r in runs[collate])
        row = (f'{collate + "_collate":<16} {size * rate:>10.0f} '
               f'{cpu:>13.1f} {rate / base:>9.2f}')
        if args.preprocess:
            prate = size * statistics.median(r['preprocess'][0]
                                             for r in runs[collate])
            pcpu = statistics.median(r['preprocess'][1]
                                     for r in runs[collate])
            row += f' {prate:>19.0f} {pcpu:>7.1f}'
        print(row)
    if not args.feed:
        return
    rates = feed_rounds(args, device, collates)
    alone = statistics.median(rates['model_alone'])
    print(f'\nFeeding {args.model} ({device}): img/s, median of '
          f'{args.rounds}; share of the model on a batch in memory; share '
          'of what the same loader hands over alone (above)')
    print(f'{"model alone (batch in memory)":<32} '
          f'{alone * args.batch_size:>8.0f}  100.0%')
    rows = [(c, c + '_collate loader') for c in collates]
    if 'block' in collates:
        rows.append(('block_placed', 'block batches placed beforehand'))
    for key, name in rows:
        rate = statistics.median(rates[key])
        row = (f'{name:<32} {rate * args.batch_size:>8.0f}  '
               f'{100 * rate / alone:5.1f}%')
        if key in runs:
            loader = statistics.median(r['handover'][0] for r in runs[key])
            row += f'  {100 * rate / loader:5.1f}% of the loader alone'
        print(row)

if __name__ == '__main__':
    main()
