// SPDX-License-Identifier: GPL-2.0
/*
 * The hypervisor's vPMU features (docs/abi.md, XENPMU_OP_FEATURE_GET / _SET): the module
 * parameter `features=` is `keep` (the default: only read and report them), `none`, or a
 * comma-separated list of `bts`, `ipc-only` and `arch-only`, set with FEATURE_SET before the
 * CPUs register (a privileged domain's operation, like the mode).
 */
#define pr_fmt(fmt) "xenpmu: " fmt

#include <linux/kernel.h>
#include <linux/gfp.h>
#include <linux/string.h>

#include "xenpmu.h"
#include "xenpmu_drv.h"

static const struct {
	const char *name;
	u32 bit;
} xenpmu_feature_names[] = {
	{ "bts", XENPMU_FEATURE_INTEL_BTS },
	{ "ipc-only", XENPMU_FEATURE_IPC_ONLY },
	{ "arch-only", XENPMU_FEATURE_ARCH_ONLY },
};

/* `list` as feature bits; *keep when it is `keep`. */
static int __init xenpmu_features_parse(const char *list, u32 *out, bool *keep)
{
	const char *p = list;

	*out = 0;
	*keep = !strcmp(list, "keep");
	if (*keep || !strcmp(list, "none"))
		return 0;
	while (*p) {
		size_t len = strcspn(p, ",");
		unsigned int i;

		for (i = 0; i < ARRAY_SIZE(xenpmu_feature_names); i++)
			if (strlen(xenpmu_feature_names[i].name) == len &&
			    !strncmp(p, xenpmu_feature_names[i].name, len))
				break;
		if (i == ARRAY_SIZE(xenpmu_feature_names)) {
			pr_err("features=%s: keep, none, or a comma-separated list of bts, ipc-only and arch-only\n",
			       list);
			return -EINVAL;
		}
		*out |= xenpmu_feature_names[i].bit;
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

/* FEATURE_GET, or FEATURE_SET of `val` retried while the hypervisor applies a change. */
static int __init xenpmu_features_op(u64 op, u64 val, u32 *features)
{
	struct xenpmu_cpu *c = (struct xenpmu_cpu *)get_zeroed_page(GFP_KERNEL);
	int rc, tries;

	if (!c)
		return -ENOMEM;
	for (tries = 0; tries < 1000; tries++) {
		rc = xenpmu_op(c, op, val, 0);
		if (rc != -XENPMU_EAGAIN)
			break;
		cpu_relax();
	}
	if (rc == 0 && op == XENPMU_OP_FEATURE_GET)
		*features = (u32)c->params.val;
	free_page((unsigned long)c);
	return rc;
}

int __init xenpmu_features_apply(const char *param)
{
	u32 wanted, features;
	bool keep;
	int rc = xenpmu_features_parse(param ? param : "", &wanted, &keep);

	if (rc)
		return rc;
	rc = xenpmu_features_op(XENPMU_OP_FEATURE_GET, 0, &features);
	if (rc) {
		pr_err("FEATURE_GET refused: %s (%d)\n", xenpmu_errname(rc), rc);
		return xenpmu_errno(rc);
	}
	if (keep || wanted == features) {
		pr_info("features 0x%x (%s)\n", features, keep ? "kept" : "already so");
		return 0;
	}
	rc = xenpmu_features_op(XENPMU_OP_FEATURE_SET, wanted, NULL);
	if (rc) {
		pr_err("features=%s: FEATURE_SET 0x%x refused: %s (%d)%s; the features stay 0x%x\n",
		       param, wanted, xenpmu_errname(rc), rc,
		       rc == -XENPMU_EPERM ? " (only the privileged domain may change them)" :
		       rc == -XENPMU_EOPNOTSUPP ? " (the hardware backend cannot enforce one)" : "",
		       features);
		return xenpmu_errno(rc);
	}
	pr_info("features 0x%x (set, was 0x%x)\n", wanted, features);
	return 0;
}
