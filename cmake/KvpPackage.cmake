# What `cmake --install` puts beside the binaries, and the Debian package CPack makes of it all
# (scripts/package.sh: `cpack -G DEB` -> kvpool_<version>_amd64.deb). Paths are Debian's; the
# binaries go to <prefix>/bin with prefix /usr in the package (the units name /usr/bin).
include(GNUInstallDirs)

set(KVP_DEPLOY ${PROJECT_SOURCE_DIR}/deploy)
install(FILES ${KVP_DEPLOY}/systemd/kvpoold.service ${KVP_DEPLOY}/systemd/kvpool-worker@.service
        DESTINATION /lib/systemd/system)
install(FILES ${KVP_DEPLOY}/kvpoold.flags ${KVP_DEPLOY}/kvpool-worker.flags DESTINATION /etc/kvpool)
install(FILES ${KVP_DEPLOY}/debian/sysusers.conf DESTINATION lib/sysusers.d RENAME kvpool.conf)
install(FILES ${KVP_DEPLOY}/debian/tmpfiles.conf DESTINATION lib/tmpfiles.d RENAME kvpool.conf)
install(FILES ${KVP_DEPLOY}/grafana/kvpool.json DESTINATION ${CMAKE_INSTALL_DATADIR}/kvpool
        RENAME grafana-dashboard.json)
install(FILES ${KVP_DEPLOY}/prometheus/kvpool-alerts.yml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/kvpool RENAME prometheus-alerts.yml)
# Debian's documentation files: the copyright notice and the changelog, compressed without a
# timestamp (gzip -n), so that two builds of one version give the same package.
install(FILES ${KVP_DEPLOY}/debian/copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/kvpool)
set(KVP_CHANGELOG_GZ ${PROJECT_BINARY_DIR}/changelog.gz)  # a native package's name
execute_process(COMMAND gzip -9nc ${KVP_DEPLOY}/debian/changelog OUTPUT_FILE ${KVP_CHANGELOG_GZ})
install(FILES ${KVP_CHANGELOG_GZ} DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/kvpool)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvpool)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # kvpool_<version>_<arch>.deb
set(CPACK_PACKAGE_CONTACT "kvpool authors <kvpool@example.org>")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "quantized paged KV-cache pool for disaggregated LLM decoding
 kvpoold owns FP8/TurboQuant paged KV caches (and DeepSeek MLA latent caches)
 in GPU or host memory; prefill and decode workers attach to them, write
 tokens and decode them with sparse attention kernels. Clients talk to it
 over ZeroMQ (Cap'n Proto messages, CURVE for remote ones). Includes the
 systemd units, the kvpool user, default flags in /etc/kvpool, kvpoolctl,
 kvpool-format, kvpool-bench, the schema and the Python client.")
# Runtime libraries from dpkg-shlibdeps (Debian's own packages, no bundled copies); the
# maintainer scripts use adduser where systemd-sysusers is missing.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, python3")  # python3: the client module
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd, python3-zmq")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${KVP_DEPLOY}/debian/postinst ${KVP_DEPLOY}/debian/prerm ${KVP_DEPLOY}/debian/postrm
    ${KVP_DEPLOY}/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_STRIP_FILES TRUE)
include(CPack)
