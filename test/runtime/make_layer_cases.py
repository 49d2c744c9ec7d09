"""make_layer_cases.py — writes the runtime tests' cases: inputs, weights and PyTorch's outputs.

Usage: make_layer_cases.py OUT_DIR   (run with the interpreter that imports torch: CRUCIBLE_PYTHON)

OUT_DIR/layer_cases.pt  {'cases': [case, ...]}, one case per layer call:
                        {'name': str, 'op': str, 'params': {str: int|float|bool|str|[int]},
                         'inputs': [tensor], 'weights': {str: tensor}, 'expected': tensor,
                         'scale': tensor (conv2d/linear only: the same op on |x|, |w|, |b|, so
                         the C++ side can bound float32 rounding as K * eps * scale)}
OUT_DIR/net_cases.pt    {net_name: {'state': module.state_dict(), 'inputs': [tensor],
                                    'outputs': [tensor]}} for the multi-node nets of net_test
OUT_DIR/weights.pt      tensors of several dtypes and layouts for weights_test
Everything is float32 from fixed seeds; nothing here is committed (CTest runs it first).
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
torch.set_num_threads(1)
torch.manual_seed(0)
ACTS = ["none", "relu", "gelu", "gelu_tanh", "sigmoid", "tanh"]


def act_fn(name, y):
    return {
        "none": lambda t: t,
        "relu": torch.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
    }[name](y)


CASES = []


def case(name, op, params, inputs, weights=None, expected=None, scale=None):
    c = {"name": name, "op": op, "params": params,
         "inputs": [t.detach().float().contiguous() for t in inputs],
         "weights": {k: v.detach().float().contiguous() for k, v in (weights or {}).items()},
         "expected": expected.detach().float().contiguous()}
    if scale is not None:
        c["scale"] = scale.detach().float().contiguous()
    CASES.append(c)


# ---------------------------------------------------------------- conv2d
def conv_case(tag, n, cin, cout, h, w, k, s, p, d, groups, bias, act):
    kh, kw = k
    weight = torch.randn(cout, cin // groups, kh, kw) / math.sqrt(cin // groups * kh * kw)
    b = torch.randn(cout) * 0.5 if bias else None
    x = torch.randn(n, cin, h, w)
    y = F.conv2d(x, weight, b, stride=s, padding=p, dilation=d, groups=groups)
    scale = F.conv2d(x.abs(), weight.abs(), b.abs() if bias else None, stride=s, padding=p,
                     dilation=d, groups=groups)
    params = {"in_channels": cin, "out_channels": cout, "kernel_h": kh, "kernel_w": kw,
              "stride_h": s[0], "stride_w": s[1], "pad_h": p[0], "pad_w": p[1],
              "dilation_h": d[0], "dilation_w": d[1], "groups": groups, "act": act}
    weights = {"weight": weight}
    if bias:
        weights["bias"] = b
    name = ("conv2d_%s_n%d_c%d_o%d_%dx%d_k%dx%d_s%dx%d_p%dx%d_d%dx%d_g%d_%s_%s" %
            (tag, n, cin, cout, h, w, kh, kw, s[0], s[1], p[0], p[1], d[0], d[1], groups,
             "bias" if bias else "nobias", act))
    case(name, "conv2d", params, [x], weights, act_fn(act, y), scale)


def conv_cases():
    kernels = [(1, 1), (3, 3), (5, 5), (3, 5), (5, 1), (2, 3)]
    strides = [(1, 1), (2, 2), (3, 3), (1, 2), (2, 1)]
    pads = [(0, 0), (1, 1), (2, 2), (0, 1), (2, 0)]
    dils = [(1, 1), (2, 2), (1, 1), (2, 1)]
    widths = [8, 24, 13, 25, 48, 7, 30, 23, 49, 16]
    heights = [5, 9, 6, 11, 4, 8]
    # (cin, cout, groups): plain, grouped, depthwise, depthwise with multiplier 2
    chans = [(3, 5, 1), (4, 6, 2), (6, 6, 6), (5, 7, 1), (8, 12, 4), (3, 6, 3), (2, 9, 1),
             (7, 7, 7), (6, 4, 2), (1, 8, 1)]
    i = 0
    for k in kernels:
        for s in strides:
            p = pads[i % len(pads)]
            d = dils[(i // 2) % len(dils)]
            cin, cout, g = chans[i % len(chans)]
            n = [1, 3][(i // 3) % 2]
            h, w = heights[i % len(heights)], widths[i % len(widths)]
            # every case has a non-empty output
            h = max(h, d[0] * (k[0] - 1) + 1 - 2 * p[0])
            w = max(w, d[1] * (k[1] - 1) + 1 - 2 * p[1])
            conv_case("sweep", n, cin, cout, h, w, k, s, p, d, g, i % 3 != 2, ACTS[i % 6])
            i += 1
    # every activation on one shape whose width is not a multiple of 8 or 24
    for j, act in enumerate(ACTS):
        conv_case("act", 1, 3, 5, 7, 29, (3, 3), (1, 1), (1, 1), (1, 1), 1, j % 2 == 0, act)
    # output widths around the 24-wide microkernel tile, stride 1 (the implicit-GEMM path)
    for wo in [22, 24, 25, 26, 47, 48, 50]:
        conv_case("tile", 1, 4, 9, 3, wo + 2, (3, 3), (1, 1), (0, 0), (1, 1), 1, True, "none")
    # padding bigger than the kernel, 1x1 inputs, a single output pixel
    conv_case("bigpad", 1, 3, 4, 3, 4, (1, 1), (1, 1), (2, 2), (1, 1), 1, True, "relu")
    conv_case("pixel", 2, 5, 3, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1), 1, True, "none")
    conv_case("single", 1, 3, 2, 5, 5, (5, 5), (1, 1), (0, 0), (1, 1), 1, False, "none")
    conv_case("dil_pad", 3, 4, 8, 10, 17, (3, 3), (1, 1), (2, 2), (2, 2), 1, True, "sigmoid")
    conv_case("dw_stride", 1, 16, 16, 14, 14, (3, 3), (2, 2), (1, 1), (1, 1), 16, True, "relu")
    conv_case("pw_wide", 1, 16, 33, 6, 27, (1, 1), (1, 1), (0, 0), (1, 1), 1, True, "gelu")
    conv_case("stride3", 3, 5, 6, 16, 31, (5, 5), (3, 3), (2, 2), (1, 1), 1, True, "tanh")
    conv_case("odd_oc", 1, 6, 17, 9, 9, (3, 3), (1, 2), (1, 0), (1, 2), 1, True, "gelu_tanh")
    # many output-channel blocks and a long reduction (K = 32 * 9 = 288)
    conv_case("wide", 2, 32, 40, 12, 30, (3, 3), (1, 1), (1, 1), (1, 1), 1, True, "relu")
    conv_case("wide_s2", 1, 24, 36, 13, 27, (3, 3), (2, 2), (1, 1), (1, 1), 1, False, "none")


# ---------------------------------------------------------------- linear
def linear_cases():
    feats = [(7, 5), (8, 16), (33, 17), (64, 10), (1, 3), (100, 1), (24, 24), (13, 40)]
    i = 0
    for rows in [1, 3, 16, 40]:
        for fin, fout in feats:
            w = torch.randn(fout, fin) / math.sqrt(fin)
            bias = i % 3 != 1
            b = torch.randn(fout) * 0.5 if bias else None
            act = ACTS[i % 6]
            x = torch.randn(rows, fin)
            if i % 7 == 3 and rows % 2 == 0:
                x = x.reshape(2, rows // 2, fin)  # leading dims
            y = F.linear(x, w, b)
            scale = F.linear(x.abs(), w.abs(), b.abs() if bias else None)
            weights = {"weight": w}
            if bias:
                weights["bias"] = b
            name = "linear_r%d_%dx%d_%s_%s_%s" % (rows, fin, fout, "bias" if bias else "nobias",
                                                  act, "x".join(map(str, x.shape)))
            case(name, "linear", {"in_features": fin, "out_features": fout, "act": act}, [x],
                 weights, act_fn(act, y), scale)
            i += 1


# ---------------------------------------------------------------- elementwise and norms
def activation_cases():
    big = torch.tensor([-1e4, -100, -89, -88, -50, -20, -10, -5, -3, -1e-6, 0, 1e-6, 3, 5, 10,
                        20, 50, 88, 89, 100, 1e4])
    for act in ACTS[1:]:
        for tag, x in [("randn37", torch.randn(37) * 3), ("4d", torch.randn(2, 3, 5, 7) * 2),
                       ("large", big), ("n64", torch.linspace(-8, 8, 64))]:
            case("act_%s_%s" % (act, tag), "activation", {"act": act}, [x], None, act_fn(act, x))


def batchnorm_cases():
    for i, (shape, affine, eps) in enumerate([
            ((1, 3, 4, 5), True, 1e-5), ((3, 5, 7, 9), False, 1e-5), ((2, 4, 6), True, 1e-3),
            ((4, 6), True, 1e-5), ((2, 8, 3, 3), False, 0.1), ((1, 16, 1, 1), True, 1e-5)]):
        c = shape[1]
        mean, var = torch.randn(c), torch.rand(c) + 0.5
        gamma, beta = torch.randn(c), torch.randn(c)
        x = torch.randn(*shape)
        y = F.batch_norm(x, mean, var, gamma if affine else None, beta if affine else None,
                         training=False, eps=eps)
        weights = {"mean": mean, "var": var}
        if affine:
            weights.update(gamma=gamma, beta=beta)
        case("batchnorm_%d_%s_%s" % (i, "x".join(map(str, shape)), "affine" if affine else "plain"),
             "batchnorm2d", {"eps": eps, "affine": affine}, [x], weights, y)


def layernorm_cases():
    for i, (shape, nd, affine, eps, offset) in enumerate([
            ((3, 10), 1, True, 1e-5, 0.0), ((2, 3, 4, 5), 2, True, 1e-5, 0.0),
            ((5, 7), 1, False, 1e-5, 0.0), ((2, 6, 9), 2, False, 1e-6, 0.0),
            ((4, 33), 1, True, 1e-5, 0.0), ((1, 64), 1, True, 1e-3, 0.0),
            ((6, 32), 1, True, 1e-5, 50.0), ((5, 1), 1, True, 1e-5, 0.0)]):
        x = torch.randn(*shape) + offset
        ns = list(shape[-nd:])
        gamma, beta = torch.randn(*ns), torch.randn(*ns)
        y = F.layer_norm(x, ns, gamma if affine else None, beta if affine else None, eps)
        weights = {"gamma": gamma, "beta": beta} if affine else {}
        case("layernorm_%d_%s_nd%d_%s%s" % (i, "x".join(map(str, shape)), nd,
                                             "affine" if affine else "plain",
                                             "_offset" if offset else ""),
             "layernorm", {"normalized_shape": ns, "eps": eps, "affine": affine}, [x], weights, y)


def softmax_cases():
    x = torch.randn(2, 3, 4, 5)
    for dim in [0, 1, 2, 3, -1, -2, -3, -4]:
        case("softmax_4d_dim%d" % dim, "softmax", {"dim": dim}, [x], None, torch.softmax(x, dim))
    v = torch.randn(7)
    case("softmax_1d", "softmax", {"dim": 0}, [v], None, torch.softmax(v, 0))
    big = torch.randn(3, 33) * 50
    big[1] = 7.0  # a row of equal values
    big[2, 5] = 200.0
    case("softmax_large", "softmax", {"dim": 1}, [big], None, torch.softmax(big, 1))
    w = torch.randn(5, 40)
    case("softmax_rows_neg", "softmax", {"dim": -1}, [w], None, torch.softmax(w, -1))
    m = torch.randn(2, 3, 6)
    m[0, 1, 2:] = float("-inf")  # masked attention scores: -inf entries get probability 0
    m[1, :, 0] = float("-inf")
    case("softmax_masked", "softmax", {"dim": -1}, [m], None, torch.softmax(m, -1))


# ---------------------------------------------------------------- pooling and padding
def pool_params(k, s, p, d=(1, 1), ceil=False, cip=True):
    return {"kernel_h": k[0], "kernel_w": k[1], "stride_h": s[0], "stride_w": s[1],
            "pad_h": p[0], "pad_w": p[1], "dilation_h": d[0], "dilation_w": d[1],
            "ceil_mode": ceil, "count_include_pad": cip}


def pool_cases():
    maxp = [((2, 2), (2, 2), (0, 0), (1, 1), False, (8, 8)),
            ((3, 3), (2, 2), (1, 1), (1, 1), False, (9, 11)),
            ((3, 3), (1, 1), (1, 1), (2, 2), False, (7, 9)),
            ((2, 3), (1, 2), (1, 0), (1, 1), False, (6, 7)),
            ((3, 3), (2, 2), (1, 1), (1, 1), True, (6, 6)),
            ((2, 2), (2, 2), (0, 0), (1, 1), True, (5, 7)),
            ((2, 2), (2, 2), (1, 1), (1, 1), True, (5, 5)),
            ((3, 2), (3, 1), (1, 1), (2, 1), True, (10, 6)),
            ((5, 5), (1, 1), (2, 2), (1, 1), False, (5, 26)),
            ((3, 3), (3, 3), (0, 0), (1, 1), True, (7, 8))]
    for i, (k, s, p, d, ceil, hw) in enumerate(maxp):
        x = torch.randn(2, 3, *hw) - 2.0  # mostly negative: padding must not win a max
        y = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil)
        case("maxpool_%d_%dx%d_k%dx%d_s%dx%d_p%dx%d_d%dx%d%s" %
             (i, hw[0], hw[1], k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1],
              "_ceil" if ceil else ""), "maxpool2d", pool_params(k, s, p, d, ceil), [x], None, y)
    avgp = [((2, 2), (2, 2), (0, 0), False, (8, 8)),
            ((3, 3), (2, 2), (1, 1), False, (9, 11)),
            ((3, 2), (2, 1), (1, 1), False, (7, 6)),
            ((3, 3), (2, 2), (1, 1), True, (6, 6)),
            ((2, 2), (2, 2), (1, 1), True, (5, 5)),
            ((3, 3), (2, 2), (0, 0), True, (8, 9)),
            ((5, 3), (3, 2), (2, 1), True, (11, 8)),
            ((3, 3), (1, 1), (1, 1), False, (4, 27))]
    for i, (k, s, p, ceil, hw) in enumerate(avgp):
        for cip in [True, False]:
            x = torch.randn(1, 4, *hw)
            y = F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=cip)
            case("avgpool_%d_%dx%d_k%dx%d_s%dx%d_p%dx%d%s_%s" %
                 (i, hw[0], hw[1], k[0], k[1], s[0], s[1], p[0], p[1], "_ceil" if ceil else "",
                  "incpad" if cip else "excpad"), "avgpool2d",
                 pool_params(k, s, p, (1, 1), ceil, cip), [x], None, y)
    for (h, w), (oh, ow) in [((6, 8), (3, 4)), ((7, 9), (3, 4)), ((5, 5), (7, 7)),
                             ((5, 3), (1, 1)), ((10, 7), (4, 3)), ((4, 4), (4, 4)),
                             ((3, 5), (5, 2)), ((1, 1), (2, 3))]:
        x = torch.randn(2, 3, h, w)
        case("adaptive_%dx%d_to_%dx%d" % (h, w, oh, ow), "adaptive_avgpool2d",
             {"out_h": oh, "out_w": ow}, [x], None, F.adaptive_avg_pool2d(x, (oh, ow)))


def pad_cases():
    specs = [("constant", (1, 2, 3, 0), 1.5, (2, 3, 4, 5)),
             ("constant", (0, 0, 0, 0), 0.0, (1, 2, 3, 3)),
             ("constant", (-1, 2, -2, 1), -0.5, (1, 2, 5, 6)),
             ("constant", (-1, -1, -1, -1), 0.0, (2, 2, 4, 5)),
             ("reflect", (2, 1, 1, 2), 0.0, (2, 3, 4, 5)),
             ("reflect", (4, 0, 0, 3), 0.0, (1, 2, 4, 5)),
             ("reflect", (-2, 3, 1, -1), 0.0, (1, 1, 3, 6)),
             ("replicate", (3, 0, 2, 4), 0.0, (2, 3, 4, 5)),
             ("replicate", (1, 1, 1, 1), 0.0, (3, 1, 1)),
             ("replicate", (-2, 3, 0, -1), 0.0, (1, 2, 3, 6)),
             ("reflect", (1, 2, 2, 1), 0.0, (3, 4, 5))]
    for i, (mode, p, value, shape) in enumerate(specs):
        x = torch.randn(*shape)
        y = F.pad(x, p, mode=mode, value=value) if mode == "constant" else F.pad(x, p, mode=mode)
        case("pad_%d_%s_%s_%s" % (i, mode, "_".join(map(str, p)), "x".join(map(str, shape))),
             "pad2d", {"left": p[0], "right": p[1], "top": p[2], "bottom": p[3], "mode": mode,
                       "value": float(value)}, [x], None, y)


# ---------------------------------------------------------------- broadcasting and views
def binary_cases():
    shapes = [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1,)), ((2, 3, 4, 5), (3, 1, 1)),
              ((3, 1, 1), (2, 3, 4, 5)), ((4, 5), (2, 3, 4, 5)), ((2, 1, 4, 1), (1, 3, 1, 5)),
              ((5,), (3, 5)), ((1,), (1,)), ((2, 3, 1, 1), (2, 3, 4, 5)), ((37,), (37,)),
              ((3, 7), (3, 1)), ((1, 8, 1, 1), (1, 8, 6, 6))]
    for op, fn in [("add", torch.add), ("mul", torch.mul)]:
        for sa, sb in shapes:
            a, b = torch.randn(*sa), torch.randn(*sb)
            case("%s_%s_by_%s" % (op, "x".join(map(str, sa)), "x".join(map(str, sb))), op, {},
                 [a, b], None, fn(a, b))


def view_cases():
    x = torch.randn(2, 3, 4, 5)
    for s, e in [(1, -1), (0, -1), (2, 3), (0, 1), (-3, -2), (1, 1)]:
        case("flatten_%d_%d" % (s, e), "flatten", {"start_dim": s, "end_dim": e}, [x], None,
             torch.flatten(x, s, e))
    v = torch.randn(7)
    case("flatten_1d", "flatten", {"start_dim": 0, "end_dim": -1}, [v], None, torch.flatten(v))
    for shape in [[6, 20], [-1, 5], [2, -1, 5], [120], [1, 2, 60, 1]]:
        case("reshape_%s" % "x".join(map(str, shape)).replace("-1", "m1"), "reshape",
             {"shape": shape}, [x], None, x.reshape(shape))


def concat_cases():
    base = [2, 3, 4, 5]
    for dim in [0, 1, 2, 3, -1, -4]:
        xs = []
        for extra in [1, 3, 2]:
            s = list(base)
            s[dim] = extra
            xs.append(torch.randn(*s))
        case("concat_4d_dim%d" % dim, "concat", {"dim": dim}, xs, None, torch.cat(xs, dim))
    a, b = torch.randn(3, 4), torch.randn(3, 7)
    case("concat_2d_dim1", "concat", {"dim": 1}, [a, b], None, torch.cat([a, b], 1))
    c, d = torch.randn(2, 4), torch.randn(5, 4)
    case("concat_2d_dimm2", "concat", {"dim": -2}, [c, d], None, torch.cat([c, d], -2))
    e = torch.randn(2, 3, 4)
    case("concat_single", "concat", {"dim": 1}, [e], None, torch.cat([e], 1))


conv_cases()
linear_cases()
activation_cases()
batchnorm_cases()
layernorm_cases()
softmax_cases()
pool_cases()
pad_cases()
binary_cases()
view_cases()
concat_cases()
torch.save({"cases": CASES}, os.path.join(OUT, "layer_cases.pt"))


# ---------------------------------------------------------------- multi-node nets
def randomize_bn(m):
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            c = mod.num_features
            mod.running_mean.copy_(torch.randn(c) * 0.5)
            mod.running_var.copy_(torch.rand(c) + 0.5)
            mod.weight.data.copy_(torch.randn(c) * 0.5 + 1.0)
            mod.bias.data.copy_(torch.randn(c) * 0.5)
    return m


class Residual(nn.Module):
    """x -> conv3x3 -> bn -> relu -> conv3x3 -> bn, + x, relu."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class SharedConv(nn.Module):
    """A convolution whose output feeds a batchnorm AND an add: the batchnorm cannot be folded."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(self.bn(y)) + y


class Squeeze(nn.Module):
    """Squeeze-excitation: x * sigmoid(conv1x1(avgpool(x))), broadcast [n, c, 1, 1]."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 6, 3, padding=1)
        self.fc = nn.Conv2d(6, 6, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        s = torch.sigmoid(self.fc(F.adaptive_avg_pool2d(y, 1)))
        z = y * s
        return F.avg_pool2d(F.pad(z, (1, 1, 1, 1), mode="replicate"), 3, 2, ceil_mode=True)


class Views(nn.Module):
    """flatten and reshape views feeding concat, then a linear; two outputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)
        self.fc = nn.Linear(60 + 12 + 40, 4)

    def forward(self, x1, x2):
        a = torch.flatten(x1, 1)                  # [2, 60]
        b = self.conv(x1).reshape(2, -1)          # [2, 40]
        cat = torch.cat([a, x2, b], 1)            # [2, 112]
        return cat, torch.sigmoid(self.fc(cat))


class SharedOutput(nn.Module):
    """A convolution that is a net output and also feeds relu and sigmoid: neither may run in
    place over it nor be fused into it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y, torch.relu(y), torch.sigmoid(y)


class Aliasing(nn.Module):
    """Folding into grouped convolutions, views whose base is also an output, one value used twice
    by concat and add, and a relu over a view of the net input (none may run in place)."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.bn1 = nn.BatchNorm2d(4)
        self.gc = nn.Conv2d(4, 6, 1, groups=2, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.head = nn.Conv2d(18, 3, 1)

    def forward(self, x):
        d = torch.relu(self.bn1(self.dw(x)))
        g = self.bn2(self.gc(d))                          # [2, 6, 6, 6]
        f = torch.flatten(g, 1)                           # [2, 216], a view of g
        r = torch.relu(f)
        cat = torch.cat([f, r, f], 1)                     # [2, 648]
        s = cat + cat
        y = torch.sigmoid(self.head(s.reshape(2, 18, 6, 6)))
        return g, y, torch.relu(torch.flatten(x, 1))


NETS = {}


def net(name, module, inputs):
    module = module.eval()
    with torch.no_grad():
        out = module(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    NETS[name] = {"state": module.state_dict(), "inputs": [t.contiguous() for t in inputs],
                  "outputs": [t.contiguous() for t in outs]}


torch.manual_seed(1)
net("conv_bn_relu_pool", randomize_bn(nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 6, 3, stride=2, bias=False), nn.BatchNorm2d(6), nn.GELU(),
    nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(6, 5), nn.Softmax(-1))),
    [torch.randn(2, 3, 17, 23)])
net("residual", randomize_bn(Residual(4)), [torch.randn(1, 4, 9, 11)])
net("shared_conv", randomize_bn(SharedConv()), [torch.randn(2, 3, 6, 7)])
net("mlp", nn.Sequential(
    nn.Linear(20, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16),
    nn.GELU(approximate="tanh"), nn.Linear(16, 7), nn.Softmax(dim=-1)),
    [torch.randn(2, 5, 20)])
net("squeeze", Squeeze(), [torch.randn(1, 6, 8, 9)])
net("views", Views(), [torch.randn(2, 3, 4, 5), torch.randn(2, 12)])
net("shared_output", SharedOutput(), [torch.randn(1, 2, 5, 6)])
net("aliasing", randomize_bn(Aliasing()), [torch.randn(2, 4, 6, 6)])
torch.save(NETS, os.path.join(OUT, "net_cases.pt"))


# ---------------------------------------------------------------- weights_test
w = torch.arange(12, dtype=torch.float32).reshape(4, 3)
torch.save({
    "dense.weight": w,
    "dense.transposed": w.t(),                    # a transposed (non-contiguous) view
    "half": torch.tensor([[0.5, -1.25], [2.0, 3.0]], dtype=torch.float16),
    "index": torch.tensor([1, -2, 3], dtype=torch.int64),
    "nested": {"bias": torch.tensor([4.0, 5.0])},
    "scalar": torch.tensor(2.5),
}, os.path.join(OUT, "weights.pt"))
print("wrote %d layer cases, %d nets to %s" % (len(CASES), len(NETS), OUT))
