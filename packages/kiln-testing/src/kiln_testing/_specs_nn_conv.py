"""Conformance specs of the nn primitives: convolution (and its transpose), im2col and col2im (behind
unfold/fold); merged into ``_specs.SPECS``."""

from __future__ import annotations

from kiln_testing._specs import Case, Ctx, OpSpec, explicit


def _convolution(c: Ctx) -> list[Case]:
    def conv(label, x, w, b, stride, padding, dilation, transposed=False, output_padding=None, groups=1):
        nd = len(x.shape) - 2
        op = output_padding if output_padding is not None else (0,) * nd
        return Case(label, (x, w, b, stride, padding, dilation, transposed, op, groups))

    return [
        conv("2d-bias", c.t((2, 3, 5, 4)), c.t((4, 3, 2, 2)), c.t((4,)), (1, 1), (0, 0), (1, 1)),
        conv(
            "2d-stride-pad-groups-transposed-input",
            c.t((2, 4, 6, 5), layout="transposed"),
            c.t((6, 2, 3, 2)),
            None,
            (2, 1),
            (1, 2),
            (1, 1),
            groups=2,
        ),
        conv("2d-dilated", c.t((1, 2, 6, 6)), c.t((3, 2, 2, 3)), c.t((3,)), (1, 2), (1, 0), (2, 1)),
        conv(
            "1d-depthwise-strided",
            c.t((2, 3, 7), layout="strided"),
            c.t((3, 1, 3)),
            c.t((3,)),
            (1,),
            (1,),
            (1,),
            groups=3,
        ),
        conv("1d-expanded-weight", c.t((2, 2, 6)), c.t((3, 2, 2), layout="expanded"), None, (2,), (0,), (1,)),
        conv("3d", c.t((1, 2, 3, 4, 3)), c.t((2, 2, 2, 2, 2)), c.t((2,)), (1, 2, 1), (0, 1, 1), (1, 1, 1)),
        conv("empty-batch", c.t((0, 3, 5, 4)), c.t((4, 3, 2, 2)), c.t((4,)), (1, 1), (0, 0), (1, 1)),
        conv(
            "transposed-2d-groups",
            c.t((2, 4, 3, 3)),
            c.t((4, 3, 2, 2)),
            c.t((6,)),
            (2, 2),
            (1, 0),
            (1, 1),
            transposed=True,
            output_padding=(1, 0),
            groups=2,
        ),
        conv(
            "transposed-1d-dilated-strided",
            c.t((2, 3, 4), layout="strided"),
            c.t((3, 2, 3)),
            None,
            (1,),
            (1,),
            (2,),
            transposed=True,
            output_padding=(1,),
        ),
        conv(
            "transposed-3d",
            c.t((1, 2, 2, 3, 2)),
            c.t((2, 2, 2, 2, 2)),
            c.t((2,)),
            (1, 2, 1),
            (0, 0, 1),
            (1, 1, 1),
            True,
        ),
    ]


def _im2col(c: Ctx) -> list[Case]:
    # (input, kernel_size, dilation, padding, stride)
    return [
        Case("kernel2", (c.t((2, 3, 4, 5)), (2, 2), (1, 1), (0, 0), (1, 1))),
        Case("params-transposed", (c.t((2, 2, 5, 6), layout="transposed"), (2, 3), (1, 2), (1, 1), (2, 1))),
        Case("unbatched-strided", (c.t((2, 4, 3), layout="strided"), (2, 2), (1, 1), (0, 1), (2, 2))),
        Case("empty-batch", (c.t((0, 2, 3, 3)), (2, 2), (1, 1), (0, 0), (1, 1))),
    ]


def _col2im(c: Ctx) -> list[Case]:
    # (input, output_size, kernel_size, dilation, padding, stride)
    return [
        Case("kernel2", (c.t((2, 12, 12)), (4, 5), (2, 2), (1, 1), (0, 0), (1, 1))),
        Case("params-transposed", (c.t((2, 12, 6), layout="transposed"), (5, 6), (2, 3), (1, 2), (1, 1), (2, 2))),
        Case("unbatched-strided", (c.t((8, 4), layout="strided"), (3, 3), (2, 2), (1, 1), (0, 1), (1, 2))),
        Case("empty-batch", (c.t((0, 8, 4)), (3, 3), (2, 2), (1, 1), (0, 0), (1, 1))),
    ]


SPECS: dict[str, OpSpec] = {
    "convolution": explicit(_convolution, rtol=1e-4, atol=1e-4),
    "im2col": explicit(_im2col),
    "col2im": explicit(_col2im),
}
