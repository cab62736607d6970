// SPDX-License-Identifier: GPL-2.0
/*
 * ECN/WRED marker with a shadow queue, for the clsact egress hook of a switch port.
 *
 * The real queue of a port is a TBF (token bucket at the emulated port rate, byte
 * FIFO behind it). tc egress runs before the qdisc, so this program keeps a model of
 * that queue per ifindex: bytes drain at the port rate using the kernel clock, and the
 * token bucket (burst) is modelled so that the shadow depth follows the real backlog.
 * On each packet, with the depth it finds:
 *   depth + len > buffer           -> drop (counted): the buffer is full; with trimming on
 *                                     (cfg.trim), an IPv4/UDP packet is instead cut to its
 *                                     headers (Ethernet, IPv4, UDP, BTH, 4 bytes for the
 *                                     ICRC: 58 bytes), remarked to DSCP 46 (not ECT) and sent
 *                                     in the control class (counted as trimmed), as Ultra
 *                                     Ethernet switches trim so the receiver learns of the
 *                                     loss at once
 *   ECT and depth >= kmax          -> mark CE
 *   ECT and kmin < depth < kmax    -> mark CE with probability pmax * (depth-kmin)/(kmax-kmin)
 * kmin == kmax is DCTCP step marking; ECN off is kmin = kmax = 2^64-1.
 *
 * Two traffic classes per port (the veths have two TX queues under an mq root): IPv4
 * packets with DSCP 48 (CNPs, ACKs: the control class) or 46 (trimmed packets) go to TX
 * queue 1, which is never
 * paused and not modelled here (only counted); everything else goes to TX queue 0, the
 * lossless RoCE data class behind the TBF that this program models. While user space has
 * paused the data class (PFC: cfg.paused), the shadow queue does not drain.
 *
 * Maps, so one loaded program serves every port of a run (the run pins program and maps
 * under its own bpffs folder) and no two writers share a value:
 *   testbed_cfg   per ifindex: settings, written by the run and by PFC (paused) only
 *                 (ports without one pass untouched)
 *   testbed_state per ifindex: shadow queue and counters, written by this program only
 *   testbed_epoch one u64, written by the collector only
 *   testbed_pfc   per ifindex: PFC counters, written by the PFC process only and read by
 *                 the collector (not used by this program: pinned with it for the run)
 *   testbed_steer (adaptive routing only) per (hop, source, destination /24): the next
 *                 switch's candidate egress ports, written by the run, and decision counters
 * "Max depth since the last read": the collector bumps the epoch, then reads; the first
 * packet of a new epoch moves the finished epoch's maximum to prev_max_depth_bytes.
 *
 * Adaptive routing (fabric.routing: adaptive), decided one hop before the switch that
 * forwards: OVS's userspace datapath reads a port through a packet socket before tc
 * ingress runs, so no program at the switch's ingress can steer it. Instead, the hop
 * that sends a data packet into a switch with several shortest-path ports toward its
 * destination (the GPU NIC, program "steer" on its egress; a switch port, this marker
 * after its queue decision) looks up those candidate ports in testbed_steer, reads each
 * one's shadow queue drained to now, and pushes an 802.1Q tag whose VID is the OpenFlow
 * port of the least occupied one (ties: the flow-hash choice, so an idle fabric routes as
 * ECMP does). The switch's flow for that VID pops the tag and outputs there. This is the
 * per-packet, queue-occupancy-driven egress choice of adaptive routing (NVIDIA Spectrum
 * "adaptive routing": the least loaded eligible port per packet), one veth hop early.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ECN_MASK 0x3
#define ECN_CE 0x3
#define MAX_ELAPSED_NS 10000000000ULL
#define DSCP_CONTROL 48
#define DSCP_TRIMMED 46
#define IPPROTO_UDP_ 17
#define TRIM_IP_LEN (20 + 8 + 12 + 4) /* IPv4, UDP, BTH, ICRC: what a trimmed packet keeps */
/* skb->queue_mapping written by tc BPF is the TX queue + 1 (0 lets the kernel pick) */
#define QUEUE_DATA 1
#define QUEUE_CONTROL 2
#define MAX_CHOICES 16 /* candidate ports per decision (the scenario checker enforces it) */
#define ETH_P_8021Q_ 0x8100

struct cfg {
	__u64 rate_bps;      /* emulated port rate (bits per second) */
	__u64 burst_bytes;   /* TBF bucket size */
	__u64 buffer_bytes;  /* drop when depth + len would exceed this */
	__u64 kmin_bytes;    /* marking starts above this depth */
	__u64 kmax_bytes;    /* every ECT packet is marked at or above this depth */
	__u64 pmax;          /* marking probability at kmax, scaled to 2^32 */
	__u64 paused;        /* non-zero while PFC pauses the data class: no drain */
	__u64 trim;          /* non-zero: trim instead of dropping */
};

struct state {
	__u64 depth_bytes;   /* shadow backlog */
	__u64 tokens_bytes;
	__u64 last_ns;
	__u64 packets;
	__u64 bytes;
	__u64 ect;
	__u64 marked;
	__u64 drops;
	__u64 max_depth_bytes;      /* in epoch 'epoch' */
	__u64 epoch;
	__u64 prev_max_depth_bytes; /* in epoch 'epoch' - 1 */
	__u64 control_packets;      /* sent in the control class (not queued here) */
	__u64 trimmed;              /* data packets cut to their headers instead of dropped */
	struct bpf_spin_lock lock;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct cfg);
} testbed_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct state);
} testbed_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} testbed_epoch SEC(".maps");

struct pfc_counters {
	__u64 frames_sent;        /* PFC frames this port sent upstream (XOFF and XON) */
	__u64 xoff_sent;
	__u64 frames_received;    /* PFC frames for the data class received on this port */
	__u64 paused_ns;          /* time its data class was paused, finished pauses */
	__u64 paused_since_ns;    /* CLOCK_MONOTONIC start of the current pause, 0 if none */
	__u64 headroom_high_water_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pfc_counters);
} testbed_pfc SEC(".maps");

struct steer_key {
	__u32 hop;      /* ifindex of the switch port the packet leaves by; 0 for a GPU NIC */
	__u32 src;      /* GPU NIC: its IPv4 source address (network order); else 0 */
	__u32 dst_net;  /* destination /24 (network order) */
};

struct steer_choice {
	__u32 n;                       /* candidates */
	__u32 pad;
	__u32 ifindex[MAX_CHOICES];    /* the next switch's egress ports (keys of testbed_state) */
	__u32 port[MAX_CHOICES];       /* their OpenFlow port numbers: the VID pushed */
	__u64 decisions;               /* packets tagged */
	__u64 moved;                   /* ... to a port other than the flow-hash choice */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct steer_key);
	__type(value, struct steer_choice);
} testbed_steer SEC(".maps");

static __always_inline void drain(struct state *s, const struct cfg *c, __u64 now)
{
	__u64 elapsed, credit, bytes_per_s = c->rate_bps / 8;

	if (now <= s->last_ns)
		return;
	elapsed = now - s->last_ns;
	if (elapsed > MAX_ELAPSED_NS || bytes_per_s == 0) {
		elapsed = elapsed > MAX_ELAPSED_NS ? MAX_ELAPSED_NS : elapsed;
		s->last_ns = now;
	}
	/* whole bytes sent in 'elapsed' ns (fits in 64 bits below ~14 Tbit/s); the clock
	 * advances only by the time those bytes took, so fractions carry to the next packet
	 * instead of being lost at every packet */
	credit = elapsed * bytes_per_s / 1000000000ULL;
	if (bytes_per_s && s->last_ns != now)
		s->last_ns += credit * 1000000000ULL / bytes_per_s;
	if (credit >= s->depth_bytes) {
		credit -= s->depth_bytes;
		s->depth_bytes = 0;
		s->tokens_bytes += credit;
		if (s->tokens_bytes >= c->burst_bytes) {
			s->tokens_bytes = c->burst_bytes;
			s->last_ns = now; /* bucket full: nothing to carry */
		}
	} else {
		s->depth_bytes -= credit;
	}
}

/* Cut the frame to its headers, set DSCP 46 (not ECT), fix the IPv4 length and checksum
 * and the UDP length (RoCE sends UDP checksum 0: nothing to fix there); the control
 * class carries it. */
static __always_inline int trim_packet(struct __sk_buff *skb, __u8 tos)
{
	__u16 old_len = 0, new_len = bpf_htons(TRIM_IP_LEN), udp_len = bpf_htons(TRIM_IP_LEN - 20);
	__u16 old_word, new_word;
	__u8 new_tos = DSCP_TRIMMED << 2;

	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tot_len), &old_len, 2) != 0)
		return TC_ACT_SHOT;
	if (bpf_skb_change_tail(skb, ETH_HLEN + TRIM_IP_LEN, 0) != 0)
		return TC_ACT_SHOT;
	old_word = bpf_htons(((__u16)0x45 << 8) | tos);
	new_word = bpf_htons(((__u16)0x45 << 8) | new_tos);
	bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_word, new_word, 2);
	bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_len, new_len, 2);
	bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &new_tos, 1, 0);
	bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tot_len), &new_len, 2, 0);
	bpf_skb_store_bytes(skb, ETH_HLEN + 20 + 4, &udp_len, 2, 0); /* UDP length */
	skb->queue_mapping = QUEUE_CONTROL;
	return TC_ACT_OK;
}

/* A port's shadow backlog drained to 'now' (read without its lock: a decision can use a
 * value one packet old). Credit in microseconds keeps the product in 64 bits. */
static __always_inline __u64 depth_now(__u32 ifindex, __u64 now)
{
	struct state *s = bpf_map_lookup_elem(&testbed_state, &ifindex);
	struct cfg *c = bpf_map_lookup_elem(&testbed_cfg, &ifindex);
	__u64 depth, last, elapsed_us, credit;

	if (!s || !c)
		return 0;
	depth = s->depth_bytes;
	last = s->last_ns;
	if (c->paused || now <= last || depth == 0)
		return depth;
	elapsed_us = (now - last) / 1000;
	if (elapsed_us > 1000000)
		return 0;
	credit = elapsed_us * (c->rate_bps / 8) / 1000000;
	return credit >= depth ? 0 : depth - credit;
}

/* Adaptive routing: tag the packet with the least occupied candidate port of the next
 * switch (see the header). 'dst' is the IPv4 destination in network order. */
static __always_inline void steer(struct __sk_buff *skb, __u32 hop, __u32 src, __u32 dst)
{
	struct steer_key k = {.hop = hop, .src = src, .dst_net = dst & bpf_htonl(0xffffff00)};
	struct steer_choice *v = bpf_map_lookup_elem(&testbed_steer, &k);
	__u64 now, best = ~0ULL, d;
	__u32 n, start, i, j, port = 0, first = 0;

	if (!v)
		return;
	n = v->n;
	if (n == 0 || n > MAX_CHOICES)
		return;
	start = bpf_get_hash_recalc(skb) % n;
	now = bpf_ktime_get_ns();
	for (i = 0; i < MAX_CHOICES; i++) {
		if (i >= n)
			break;
		j = start + i;
		if (j >= n)
			j -= n;
		if (j >= MAX_CHOICES)
			break;
		d = depth_now(v->ifindex[j], now);
		if (i == 0)
			first = v->port[j];
		if (d < best) {
			best = d;
			port = v->port[j];
		}
	}
	if (port == 0 || bpf_skb_vlan_push(skb, bpf_htons(ETH_P_8021Q_), (__u16)port) != 0)
		return;
	__sync_fetch_and_add(&v->decisions, 1);
	if (port != first)
		__sync_fetch_and_add(&v->moved, 1);
}

/* IPv4 source and destination of a data packet (not the control class); 0 if none. */
static __always_inline int data_addrs(struct __sk_buff *skb, __u32 *src, __u32 *dst)
{
	__u16 proto = 0;
	__u8 vihl_tos[2] = {0, 0};
	__u32 addrs[2];

	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2) != 0 || proto != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, vihl_tos, 2) != 0 || (vihl_tos[0] >> 4) != 4)
		return 0;
	if ((vihl_tos[1] >> 2) == DSCP_CONTROL || (vihl_tos[1] >> 2) == DSCP_TRIMMED)
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, saddr), addrs, 8) != 0)
		return 0;
	*src = addrs[0];
	*dst = addrs[1];
	return 1;
}

/* The GPU NIC's egress (adaptive routing only): the leaf's choice, made on the way in. */
SEC("tc")
int steer_nic(struct __sk_buff *skb)
{
	__u32 src = 0, dst = 0;

	if (data_addrs(skb, &src, &dst))
		steer(skb, 0, src, dst);
	return TC_ACT_OK;
}

SEC("tc")
int marker(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex, zero_key = 0;
	__u64 *epoch_p;
	struct cfg *c = bpf_map_lookup_elem(&testbed_cfg, &ifindex);
	struct state *s, zero = {};
	__u16 proto = 0;
	__u8 vihl_tos[2] = {0, 0}; /* IPv4 version/IHL byte and TOS */
	__u8 ip_proto = 0;
	__u64 len = skb->len, depth, span, now, epoch, rate, burst, buffer, kmin, kmax, pmax, trim;
	__u32 draw, dst = 0;
	int is_ip = 0, is_ect = 0, is_control = 0, verdict = 0; /* 0 pass, 1 mark, 2 drop, 3 trim */

	if (!c)
		return TC_ACT_OK;
	s = bpf_map_lookup_elem(&testbed_state, &ifindex);
	if (!s) {
		bpf_map_update_elem(&testbed_state, &ifindex, &zero, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&testbed_state, &ifindex);
		if (!s)
			return TC_ACT_OK;
	}
	/* settings are read once, outside the lock (user space may rewrite them) */
	rate = c->paused ? 0 : c->rate_bps;
	burst = c->burst_bytes;
	buffer = c->buffer_bytes;
	kmin = c->kmin_bytes;
	kmax = c->kmax_bytes;
	pmax = c->pmax;
	trim = c->trim;
	epoch_p = bpf_map_lookup_elem(&testbed_epoch, &zero_key);
	epoch = epoch_p ? *epoch_p : 0;

	/* Headers are read with bpf_skb_load_bytes, not direct packet access: a frame larger
	 * than a page sent through a packet socket (OVS's userspace datapath, RoCE's 4 KB
	 * payloads) has only its Ethernet header in the linear area. */
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, 2) == 0 &&
	    proto == bpf_htons(ETH_P_IP) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN, vihl_tos, 2) == 0 && (vihl_tos[0] >> 4) == 4) {
		is_ip = 1;
		is_ect = (vihl_tos[1] & ECN_MASK) != 0;
		is_control = (vihl_tos[1] >> 2) == DSCP_CONTROL || (vihl_tos[1] >> 2) == DSCP_TRIMMED;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, protocol), &ip_proto, 1) != 0)
			ip_proto = 0;
	}
	if (is_control) {
		/* one store through the context pointer (the verifier refuses a derived one) */
		skb->queue_mapping = QUEUE_CONTROL;
		__sync_fetch_and_add(&s->control_packets, 1);
		return TC_ACT_OK;
	}
	/* Not IPv4: the one-frame restart the PFC process sends into the data queue when it
	 * resumes the port (a TBF whose rate changed keeps the watchdog it set at the paused
	 * rate, so its backlog waits for the next arrival otherwise). Not data: not modelled. */
	if (!is_ip) {
		skb->queue_mapping = QUEUE_DATA;
		return TC_ACT_OK;
	}
	draw = bpf_get_prandom_u32();
	now = bpf_ktime_get_ns(); /* no helper calls while holding the lock */

	bpf_spin_lock(&s->lock);
	{
		struct cfg snap = {.rate_bps = rate, .burst_bytes = burst};

		if (s->last_ns == 0) {
			s->last_ns = now;
			s->tokens_bytes = burst;
		}
		drain(s, &snap, now);
	}
	if (s->epoch != epoch) {
		s->prev_max_depth_bytes = s->max_depth_bytes;
		s->max_depth_bytes = s->depth_bytes;
		s->epoch = epoch;
	}
	depth = s->depth_bytes;
	s->packets++;
	s->bytes += len;
	if (is_ect)
		s->ect++;
	if (depth + len > buffer && trim && ip_proto == IPPROTO_UDP_ && vihl_tos[0] == 0x45 &&
	    len > ETH_HLEN + TRIM_IP_LEN) {
		verdict = 3;
		s->trimmed++;
	} else if (depth + len > buffer) {
		verdict = 2;
		s->drops++;
	} else {
		if (is_ect && depth >= kmax) {
			verdict = 1;
		} else if (is_ect && depth > kmin) {
			span = kmax - kmin;
			/* draw < pmax * (depth - kmin) / span; both products stay below 2^64
			 * because pmax <= 2^32 and depth - kmin < span < 2^32 */
			if ((__u64)draw * span < pmax * (depth - kmin))
				verdict = 1;
		}
		if (verdict == 1)
			s->marked++;
		/* enqueue: straight through on tokens, else it waits in the FIFO */
		if (s->depth_bytes == 0 && s->tokens_bytes >= len)
			s->tokens_bytes -= len;
		else
			s->depth_bytes += len;
		if (s->depth_bytes > s->max_depth_bytes)
			s->max_depth_bytes = s->depth_bytes;
	}
	bpf_spin_unlock(&s->lock);

	if (verdict == 2)
		return TC_ACT_SHOT;
	if (verdict == 3)
		return trim_packet(skb, vihl_tos[1]);
	skb->queue_mapping = QUEUE_DATA;
	if (verdict == 1) {
		__u8 tos, ce;
		__u16 old, new;

		/* set CE and fix the IP checksum (the helpers work on non-linear frames too) */
		tos = vihl_tos[1];
		if ((tos & ECN_MASK) == ECN_CE)
			goto out;
		ce = tos | ECN_CE;
		/* the 16-bit word holding version/ihl and tos */
		old = bpf_htons(((__u16)vihl_tos[0] << 8) | tos);
		new = bpf_htons(((__u16)vihl_tos[0] << 8) | ce);
		bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, new, 2);
		bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &ce, 1, 0);
	}
out:
	/* adaptive routing: the next switch's choice (no entry in testbed_steer: ECMP) */
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, daddr), &dst, 4) == 0)
		steer(skb, ifindex, 0, dst);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
