package io.mailtap.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/**
 * The bean the build step of apicurio-common-app-components-config-index would generate: the list
 * of properties that can be changed at run time through the admin API. Its deployment jar is not
 * available (see pom.xml), so the list is empty: every setting is fixed at start, which is all a
 * local development registry needs.
 */
@ApplicationScoped
public class EmptyDynamicConfig {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
