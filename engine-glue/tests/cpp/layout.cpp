/*
 * layout.cpp: prints the size of every struct of the drop-in headers that dlock's library
 * reads or writes, the offset of each field, and where the fair lock's bit fields sit, as
 * this compiler lays them out, for engine-glue/tests/reference_headers.rs to compare with the
 * Rust side. Compiled with -Wextra -pedantic too: the headers must be clean under both.
 */

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "dlock_client_api.h"
#include "dlock_server_api.h"

using namespace dlock;

#define SIZE(t) printf("size %s %zu\n", #t, sizeof(t))
#define FIELD(t, f) printf("field %s.%s %zu\n", #t, #f, offsetof(t, f))

/* The bits of t_value a bit field covers: the field set to all ones, nothing else. */
#define BITS(f, ones)                                                  \
    do {                                                               \
        fairlock_state s;                                              \
        memset(&s, 0, sizeof(s));                                      \
        s.bs.f = ones;                                                 \
        printf("bits fairlock_state.bs.%s %#x\n", #f, s.t_value);       \
    } while (0)

int main()
{
    SIZE(dlock_eid_t);
    SIZE(ssl_cfg);
    FIELD(ssl_cfg, ssl_enable);
    FIELD(ssl_cfg, ca_path);
    FIELD(ssl_cfg, crl_path);
    FIELD(ssl_cfg, cert_path);
    FIELD(ssl_cfg, prkey_path);
    FIELD(ssl_cfg, cert_verify_cb);
    FIELD(ssl_cfg, prkey_pwd_cb);
    FIELD(ssl_cfg, erase_prkey_cb);
    SIZE(client_cfg);
    FIELD(client_cfg, dev_name);
    FIELD(client_cfg, eid);
    FIELD(client_cfg, log_level);
    FIELD(client_cfg, primary_port);
    FIELD(client_cfg, ssl);
    FIELD(client_cfg, tp_mode);
    FIELD(client_cfg, ub_token_disable);
    SIZE(replica_cfg);
    FIELD(replica_cfg, primary_ip_str);
    FIELD(replica_cfg, primary_port);
    SIZE(primary_cfg);
    FIELD(primary_cfg, num_of_replica);
    FIELD(primary_cfg, recovery_client_num);
    FIELD(primary_cfg, ctrl_cpuset);
    FIELD(primary_cfg, cmd_cpuset);
    FIELD(primary_cfg, server_ip_str);
    FIELD(primary_cfg, server_port);
    FIELD(primary_cfg, replica_port);
    FIELD(primary_cfg, replica_enable);
    SIZE(server_cfg);
    FIELD(server_cfg, type);
    FIELD(server_cfg, dev_name);
    FIELD(server_cfg, eid);
    FIELD(server_cfg, log_level);
    FIELD(server_cfg, sleep_mode_enable);
    FIELD(server_cfg, primary);
    FIELD(server_cfg, replica);
    FIELD(server_cfg, ssl);
    FIELD(server_cfg, tp_mode);
    FIELD(server_cfg, ub_token_disable);
    SIZE(server_cfg_ext);
    FIELD(server_cfg_ext, locks_max);
    FIELD(server_cfg_ext, clients_max);
    FIELD(server_cfg_ext, objects_max);
    FIELD(server_cfg_ext, client_lease_ms);
    FIELD(server_cfg_ext, client_lease_max_ms);
    FIELD(server_cfg_ext, epoch);
    FIELD(server_cfg_ext, insecure_plaintext);
    FIELD(server_cfg_ext, insecure_recovery);
    FIELD(server_cfg_ext, session_key_file);
    FIELD(server_cfg_ext, recoverer_local);
    SIZE(client_cfg_ext);
    FIELD(client_cfg_ext, lease_ms);
    FIELD(client_cfg_ext, timeout_ms);
    SIZE(debug_stats);
    SIZE(atomic_state);
    FIELD(atomic_state, client_id);
    FIELD(atomic_state, time_out);
    SIZE(rw_state);
    FIELD(rw_state, time_out);
    FIELD(rw_state, client_id);
    FIELD(rw_state, rcount);
    FIELD(rw_state, rsvd);
    SIZE(fairlock_state);
    FIELD(fairlock_state, n_exclusive);
    FIELD(fairlock_state, n_shared);
    FIELD(fairlock_state, m_exclusive);
    FIELD(fairlock_state, m_shared);
    FIELD(fairlock_state, time_out);
    FIELD(fairlock_state, t_value);
    BITS(rms, 0xFFFF);
    BITS(rflag, 1);
    BITS(rcnt, 63);
    SIZE(lock_state);
    SIZE(lock_op_res);
    FIELD(lock_op_res, atomic);
    FIELD(lock_op_res, op_ret);
    SIZE(lock_desc);
    FIELD(lock_desc, p_desc);
    FIELD(lock_desc, len);
    FIELD(lock_desc, lock_type);
    FIELD(lock_desc, lease_time);
    SIZE(lock_request);
    FIELD(lock_request, lock_id);
    FIELD(lock_request, lock_op);
    FIELD(lock_request, expire_time);
    SIZE(umo_atomic64_desc);
    FIELD(umo_atomic64_desc, p_desc);
    FIELD(umo_atomic64_desc, len);
    FIELD(umo_atomic64_desc, lease_time);
    return 0;
}
